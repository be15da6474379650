"""The llama.cpp build the venv has cannot reach the AMX kernels, still decodes, and a native crash at
startup is reported (in a child process) instead of taking the replica down."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys

import pytest

from app.engine import hardware, llama
from app.engine.selfcheck import EngineUnavailable, run_self_check
from tools import llama_build

pytestmark = pytest.mark.model  # every test here loads llama.cpp (and most the bundled model)


def test_loaded_llama_cpp_has_no_amx_kernels():
    # tools/llama_build.py compiles AMX out (-mno-amx-*); a build that has them fails here on any CPU.
    info = hardware.system_info()
    assert "CPU :" in info, info
    assert not hardware.build_has_amx(info), f"this venv's llama.cpp was built with AMX kernels: {info}"


def test_bundled_model_loads_outside_any_amx_buffer_and_decodes(bundled_spec):
    # Its own small context (the shared engine's decode thread owns that one); llama.cpp's load log
    # says where the weights went.
    model = llama.LlamaModelContext(bundled_spec.path, n_ctx_per_seq=128, n_seq_max=1, n_batch=64, n_threads=2,
                                 n_threads_batch=2, n_gpu_layers=0, kv_unified=True,
                                 extra_buffers=hardware.use_extra_buffers("auto", hardware.system_info()))
    try:
        assert llama.model_buffers, "no 'model buffer size' line was seen while loading"
        assert not [name for name in llama.model_buffers if "AMX" in name.upper()], llama.model_buffers
        token = llama.greedy_token(model, model.tokenize("The capital of France is"))
        assert model.piece(token).decode().strip() == "Paris"  # one real decode, with a real answer
    finally:
        model.close()


def test_venv_records_the_build_it_was_given():
    record = hardware.build_record()
    if record is None:
        pytest.skip("llama-cpp-python in this environment was not installed by tools/llama_build.py "
                    "(make install records it); nothing to compare")
    env = llama_build.build_env(cuda="GGML_CUDA" in record["env"]["CMAKE_ARGS"], cuda_arch=None)
    assert record["env"]["CFLAGS"] == env["CFLAGS"] == llama_build.NO_AMX
    assert hardware.missing_isa(record) == []


def test_build_key_changes_with_flags_and_cpu(monkeypatch):
    env = llama_build.build_env(cuda=False, cuda_arch=None)
    key = llama_build.build_key(env, "0.3.36")
    assert key == llama_build.build_key(dict(env), "0.3.36")
    assert key != llama_build.build_key(llama_build.build_env(cuda=True, cuda_arch="90"), "0.3.36")
    assert key != llama_build.build_key(env, "0.3.37")
    monkeypatch.setattr(llama_build, "cpu_flags", lambda: ["avx2", "amx_tile"])
    assert key != llama_build.build_key(env, "0.3.36")


def test_build_env_keeps_native_kernels_and_drops_amx():
    env = llama_build.build_env(cuda=False, cuda_arch=None)
    assert env["CMAKE_ARGS"] == "-DGGML_NATIVE=ON"
    if llama_build.is_x86():
        assert set(env["CFLAGS"].split()) == {"-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"}


def test_self_check_passes_on_the_bundled_model(bundled_spec):
    report = run_self_check(bundled_spec)
    assert report["ok"] and report["extra_buffers"] is True and report["token"] >= 0
    assert not hardware.build_has_amx(report["system_info"])


def test_self_check_reports_a_native_crash_without_dying(bundled_spec):
    # A real SIGSEGV in the child (a NULL read through ctypes) stands in for llama.cpp's AMX crash.
    crash = [sys.executable, "-c", "import ctypes; ctypes.string_at(0)"]
    with pytest.raises(EngineUnavailable) as err:
        run_self_check(bundled_spec, command=crash)
    text = str(err.value)
    assert "SIGSEGV" in text and bundled_spec.id in text and "CPU: " in text


def test_self_check_reports_a_model_llama_cpp_cannot_load(bundled_spec, tmp_path):
    truncated = tmp_path / "truncated.gguf"
    with open(bundled_spec.path, "rb") as src, open(truncated, "wb") as dst:
        dst.write(src.read(8 << 20))  # metadata intact, tensor data cut
    with pytest.raises(EngineUnavailable, match=r"llama.cpp could not load truncated.gguf: .*corrupted or incomplete"):
        run_self_check(dataclasses.replace(bundled_spec, path=str(truncated)))


def test_no_compiler_no_problem_for_the_key(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert llama_build.compiler_version() == "unknown"


def test_no_amx_flags_win_over_march_on_an_amx_cpu():
    # On an AMX machine GGML_NATIVE means -march=native = an AMX -march; the build's CFLAGS come first
    # on the command line, so this checks that the compiler honours them whatever the order.
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not llama_build.is_x86():
        pytest.skip("needs an x86 C compiler (the one that builds llama.cpp); none on PATH here")
    cmd = [cc, *llama_build.NO_AMX.split(), "-march=sapphirerapids", "-dM", "-E", "-x", "c", "/dev/null"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "__AVX512VNNI__" in out  # the rest of the CPU's kernels stay
    assert "__AMX_INT8__" not in out and "__AMX_TILE__" not in out
    plain = subprocess.run([cc, "-march=sapphirerapids", "-dM", "-E", "-x", "c", "/dev/null"],
                           capture_output=True, text=True, check=True).stdout
    assert "__AMX_INT8__" in plain  # the check above can fail
