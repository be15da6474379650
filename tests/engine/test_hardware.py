"""The CPU/build facts that keep llama.cpp's AMX kernels out of reach, and the words of a crash report."""

from __future__ import annotations

import pytest

from app.engine import hardware

AMX_CPU = frozenset({"avx2", "avx512f", "avx512_vnni", "amx_tile", "amx_int8", "amx_bf16"})
AVX2_CPU = frozenset({"avx", "avx2", "fma", "f16c"})
AMX_BUILD = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | OPENMP = 1 | REPACK = 1 |"
PLAIN_BUILD = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 1 | OPENMP = 1 | REPACK = 1 |"


@pytest.mark.parametrize(("setting", "info", "flags", "expected"), [
    ("auto", AMX_BUILD, AMX_CPU, False),     # the crashing combination: weights stay out of the AMX buffer
    ("auto", AMX_BUILD, AVX2_CPU, True),     # AMX kernels compiled in, but this CPU never runs them
    ("auto", PLAIN_BUILD, AMX_CPU, True),    # our build: AMX compiled out, repacking kept
    ("off", PLAIN_BUILD, AVX2_CPU, False),
    ("on", AMX_BUILD, AMX_CPU, True),        # explicit opt-in wins
])
def test_extra_buffers_are_off_only_where_amx_kernels_would_run(setting, info, flags, expected):
    assert hardware.use_extra_buffers(setting, info, flags) is expected


def test_build_has_amx_reads_llama_cpp_system_info():
    assert hardware.build_has_amx(AMX_BUILD)
    assert not hardware.build_has_amx(PLAIN_BUILD)
    assert not hardware.build_has_amx(PLAIN_BUILD.replace("OPENMP", "AMX_INT8 = 0 | OPENMP"))


def test_missing_isa_names_features_of_the_build_cpu_this_cpu_lacks():
    record = {"cpu_flags": sorted(AMX_CPU | {"fpu"})}
    assert hardware.missing_isa(record, AVX2_CPU) == ["amx_bf16", "amx_int8", "amx_tile", "avx512_vnni", "avx512f"]
    assert hardware.missing_isa(record, AMX_CPU) == []
    assert hardware.missing_isa(None, AVX2_CPU) == []


def test_crash_hints_name_the_amx_cause(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: AMX_CPU)
    monkeypatch.setattr(hardware, "build_record", lambda: None)
    (hint,) = hardware.crash_hints(AMX_BUILD)
    assert "#20824" in hint and "cpu_extra_buffers: off" in hint
    assert hardware.crash_hints(PLAIN_BUILD) == []


def test_crash_hints_name_a_build_from_another_cpu(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: AVX2_CPU)
    monkeypatch.setattr(hardware, "build_record", lambda: {"cpu_flags": ["avx2", "avx512f"]})
    (hint,) = hardware.crash_hints(PLAIN_BUILD)
    assert "avx512f" in hint and "rebuild" in hint


def test_describe_names_the_cpu_and_build():
    text = hardware.describe(PLAIN_BUILD)
    assert text.startswith("CPU: ") and "llama-cpp-python" in text and "AVX2 = 1" in text
