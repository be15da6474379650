"""The portable build (tools/llama_build.py --portable): its flags and cache key, the patch that leaves
llama.cpp's AMX CPU variants out, how the engine names the CPU variant it runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine import hardware, llama
from tools import llama_build

ROOT = Path(__file__).resolve().parents[2]

# The x86 part of ggml/src/CMakeLists.txt as llama-cpp-python 0.3.36 vendors it (shortened).
VARIANTS = """\
function(ggml_add_cpu_backend_variant tag_name)
    set(GGML_CPU_TAG_NAME ${tag_name})
    ggml_add_cpu_backend_variant_impl(${tag_name})
endfunction()

if (GGML_CPU_ALL_VARIANTS)
    if (GGML_SYSTEM_ARCH STREQUAL "x86")
        ggml_add_cpu_backend_variant(x64)
        ggml_add_cpu_backend_variant(haswell            SSE42 AVX F16C FMA AVX2 BMI2)
        ggml_add_cpu_backend_variant(zen4           SSE42 AVX F16C FMA AVX2 BMI2 AVX512 AVX512_VBMI AVX512_VNNI AVX512_BF16)
        if (NOT MSVC)
            # MSVC doesn't support AMX
            ggml_add_cpu_backend_variant(sapphirerapids SSE42 AVX F16C FMA AVX2 BMI2 AVX512 AVX512_VBMI AVX512_VNNI AVX512_BF16 AMX_TILE AMX_INT8)
        endif()
    endif()
else ()
    ggml_add_cpu_backend_variant_impl("")
endif()
"""


def test_portable_env_builds_every_cpu_variant_as_a_loadable_library():
    env = llama_build.build_env(cuda=False, cuda_arch=None, portable=True)
    args = env["CMAKE_ARGS"].split()
    assert {"-DGGML_NATIVE=OFF", "-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON"} <= set(args)
    assert "-DCMAKE_INSTALL_BINDIR=llama_cpp/lib" in args  # the variants land next to libggml
    assert "CFLAGS" not in env and "CXXFLAGS" not in env  # no -march: each variant sets its own
    assert llama_build.is_portable(env) and not llama_build.is_portable(llama_build.build_env(False, None))


def test_portable_cuda_compiles_for_an_architecture_list_unless_told_one():
    args = llama_build.build_env(cuda=True, cuda_arch=None, portable=True)["CMAKE_ARGS"].split()
    assert "-DGGML_CUDA=on" in args and "-DCMAKE_CUDA_ARCHITECTURES=75;80;86;89;90" in args
    args = llama_build.build_env(cuda=True, cuda_arch="89;90", portable=True)["CMAKE_ARGS"].split()
    assert "-DCMAKE_CUDA_ARCHITECTURES=89;90" in args
    # The native build stays as it was: -march=native, AMX compiled out, CUDA's own default arch.
    native = llama_build.build_env(cuda=True, cuda_arch=None)
    assert native["CMAKE_ARGS"] == "-DGGML_NATIVE=ON -DGGML_CUDA=on"


def test_portable_key_is_its_own_and_ignores_this_cpu(monkeypatch):
    portable = llama_build.build_env(cuda=False, cuda_arch=None, portable=True)
    native = llama_build.build_env(cuda=False, cuda_arch=None)
    key = llama_build.build_key(portable, "0.3.36")
    assert key != llama_build.build_key(native, "0.3.36")  # its own wheel cache directory
    assert key != llama_build.build_key(llama_build.build_env(True, None, portable=True), "0.3.36")
    native_key = llama_build.build_key(native, "0.3.36")
    monkeypatch.setattr(llama_build, "cpu_flags", lambda: ["avx2", "amx_tile"])
    assert llama_build.build_key(portable, "0.3.36") == key  # the same wheel for any CPU
    assert llama_build.build_key(native, "0.3.36") != native_key
    monkeypatch.setattr(llama_build, "PORTABLE_PATCH", "another patch")
    assert llama_build.build_key(portable, "0.3.36") != key  # a changed patch is a new build


def test_cli_prints_the_portable_key_and_env():
    run = [sys.executable, str(ROOT / "tools" / "llama_build.py")]
    key = subprocess.run([*run, "--key", "--portable"], capture_output=True, text=True, check=True).stdout.strip()
    native = subprocess.run([*run, "--key"], capture_output=True, text=True, check=True).stdout.strip()
    assert len(key) == 16 and key != native
    env = json.loads(subprocess.run([*run, "--env", "--portable"], capture_output=True, text=True,
                                    check=True).stdout)
    assert "-DGGML_CPU_ALL_VARIANTS=ON" in env["CMAKE_ARGS"]


def test_drop_amx_variants_removes_only_the_amx_ones():
    patched, dropped = llama_build.drop_amx_variants(VARIANTS)
    assert dropped == ["sapphirerapids"]
    assert "sapphirerapids" not in patched and "AMX_" not in patched
    for kept in ("ggml_add_cpu_backend_variant(x64)", "ggml_add_cpu_backend_variant(haswell",
                 "ggml_add_cpu_backend_variant(zen4", "function(ggml_add_cpu_backend_variant tag_name)",
                 'ggml_add_cpu_backend_variant_impl("")', "# MSVC doesn't support AMX\n        endif()"):
        assert kept in patched, kept
    assert len(VARIANTS.splitlines()) - len(patched.splitlines()) == 1
    assert llama_build.drop_amx_variants(patched) == (patched, [])


def test_drop_amx_variants_refuses_a_file_without_the_variant_list():
    with pytest.raises(SystemExit, match="cannot leave the AMX variants out"):
        llama_build.drop_amx_variants("add_subdirectory(ggml-cpu)\n")


def test_loaded_backend_log_names_the_cpu_variant(monkeypatch):
    monkeypatch.setattr(llama, "loaded_backends", {})
    monkeypatch.setattr(llama, "init_backend", lambda: None)
    assert llama.cpu_backend() == "linked in"
    # What ggml logs when it loads a backend library (ggml-backend-reg.cpp), through our callback.
    llama._llama_log(2, b"load_backend: loaded CPU backend from /v/llama_cpp/lib/libggml-cpu-haswell.so\n", None)
    assert llama.loaded_backends == {"CPU": "/v/llama_cpp/lib/libggml-cpu-haswell.so"}
    assert llama.cpu_backend() == "haswell"


def test_describe_names_the_cpu_backend():
    assert "CPU backend: zen4 (variant chosen at run time)" in hardware.describe("CPU : AVX2 = 1 |", "zen4")
    assert "CPU backend: linked in;" in hardware.describe("CPU : AVX2 = 1 |", "linked in")
    assert "CPU backend" not in hardware.describe("CPU : AVX2 = 1 |")


@pytest.mark.model
def test_native_build_needs_no_backend_loading(bundled_spec):
    # This venv's build links its CPU backend in: nothing is loaded from llama_cpp/lib, and the
    # self-check says so.
    assert hardware.cpu_backend() == "linked in" and "CPU" not in llama.loaded_backends
    from app.engine.selfcheck import run_self_check

    report = run_self_check(bundled_spec)
    assert report["ok"] and report["cpu_backend"] == "linked in"


# The built wheel itself (its variants, the one this CPU gets, a decode) is checked by `make test-portable`
# (tools/portable_check.py): building it takes longer than a test run should.
