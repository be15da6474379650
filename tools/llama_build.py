"""Build and install llama-cpp-python the way llamaray runs it, cached by everything the build depends on.

Why not a plain `pip install llama-cpp-python`:

- pip compiles llama.cpp with GGML_NATIVE (`-march=native`). On a CPU with AMX that turns on llama.cpp's
  AMX kernels, and those crash at the first decode on some AMX CPUs (llama.cpp #20824: SIGSEGV in
  ggml_backend_amx_mul_mat). We keep `-march=native` (the best kernels this CPU has: AVX2, AVX-512,
  VNNI, BF16) and compile only AMX out with `-mno-amx-*`, which GCC and Clang honour whatever the order
  of `-march`.
- pip's wheel cache keys a built wheel by the sdist alone, not by CMAKE_ARGS and not by the CPU it was
  compiled for, so it would hand a wheel built with other flags (or for another CPU) to the next
  install. We build with `--no-cache-dir` and keep our own cache, keyed by version, flags, compiler and
  the CPU's instruction-set flags: `~/.cache/llamaray/wheels/<key>/`.

`--portable` builds for images that run on CPUs other than the build machine's: llama.cpp's CPU backend
as runtime-loaded variants (GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS, no -march=native), one shared
library per x86 level (libggml-cpu-haswell.so, -skylakex.so, -zen4.so, ...) next to libllama in the
wheel; at startup ggml scores each against the CPU it runs on and loads the best. The variants that
enable AMX (sapphirerapids) are removed from the vendored ggml/src/CMakeLists.txt before the build, so
an AMX CPU gets the best AVX-512 variant instead (#20824 again). Its key leaves out this CPU's flags:
the wheel suits any x86-64 CPU. With CUDA it compiles for an architecture list (PORTABLE_CUDA_ARCHS).

The installed build is recorded in `<venv>/llamaray-build.json`; the engine reads it to explain a
crash (built on another CPU, built without our flags). Standard library only: it runs before the venv
has anything in it.

    python tools/llama_build.py --key [--portable]        # the cache key of this machine's build
    python tools/llama_build.py --wheel [--portable]      # build (or find) the cached wheel; print its path
    python tools/llama_build.py --install .venv/bin/python [--portable] [--cuda [--cuda-arch 86]]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD_RECORD = "llamaray-build.json"
# AMX compiled out; everything else -march=native picks stays on.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
# T4, A100, A10G/RTX 30xx, L4/RTX 40xx, H100/H200: what a portable GPU image compiles for by default.
PORTABLE_CUDA_ARCHS = "75;80;86;89;90"
# Every CPU variant as a runtime-loaded library. They install to CMAKE_INSTALL_BINDIR, which
# llama-cpp-python leaves at the wheel's root; llama_cpp/lib puts them next to libggml, where the
# engine loads them from (app/engine/llama.py).
PORTABLE_CMAKE = ("-DGGML_NATIVE=OFF", "-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON",
                  "-DCMAKE_INSTALL_BINDIR=llama_cpp/lib")
VARIANTS_CMAKELISTS = "vendor/llama.cpp/ggml/src/CMakeLists.txt"
# Names the source patch in the portable key: change it when drop_amx_variants changes what it removes.
PORTABLE_PATCH = "ggml/src/CMakeLists.txt without the AMX CPU variants, v1"
_VARIANT_CALL = re.compile(r"^[ \t]*ggml_add_cpu_backend_variant\((\S+)([^)]*)\)[ \t]*\n", re.MULTILINE)


def pinned_version() -> str:
    """llama-cpp-python's version as pinned in pyproject.toml (one place for the pin)."""
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(r'"llama-cpp-python==([0-9][^"]*)"', text)
    if not match:
        sys.exit("pyproject.toml does not pin llama-cpp-python==<version>")
    return match.group(1)


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


def cpu_flags() -> list[str]:
    """The instruction-set flags of this CPU (what -march=native compiles for)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return [platform.machine(), platform.processor()]
    match = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, re.MULTILINE)
    return sorted(set(match.group(1).split())) if match else [platform.machine()]


def compiler_version() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or "cc"
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "unknown"
    return out.splitlines()[0] if out else "unknown"


def build_env(cuda: bool, cuda_arch: str | None, portable: bool = False) -> dict[str, str]:
    """CMAKE_ARGS / CFLAGS / CXXFLAGS for the build (the native one is also used for llama-server).
    Portable: no -march at all (each variant sets its own), so no CFLAGS; CUDA for PORTABLE_CUDA_ARCHS
    unless `cuda_arch` names others."""
    cmake = list(PORTABLE_CMAKE) if portable else ["-DGGML_NATIVE=ON"]
    if cuda:
        cmake.append("-DGGML_CUDA=on")
        arch = cuda_arch or (PORTABLE_CUDA_ARCHS if portable else None)
        if arch:
            cmake.append(f"-DCMAKE_CUDA_ARCHITECTURES={arch}")
    env = {"CMAKE_ARGS": " ".join(cmake)}
    if is_x86() and not portable:
        env["CFLAGS"] = env["CXXFLAGS"] = NO_AMX
    return env


def is_portable(env: dict[str, str]) -> bool:
    return "-DGGML_CPU_ALL_VARIANTS=ON" in env.get("CMAKE_ARGS", "").split()


def build_key(env: dict[str, str], version: str) -> str:
    """Native: this CPU's flags are part of the key (the wheel is for this CPU). Portable: they are not
    (it suits any CPU of this architecture), and the source patch is."""
    if is_portable(env):
        machine = ["portable", platform.machine(), PORTABLE_PATCH]
    else:
        machine = [platform.machine(), *cpu_flags()]
    parts = [version, json.dumps(env, sort_keys=True), compiler_version(), *machine]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def drop_amx_variants(cmakelists: str) -> tuple[str, list[str]]:
    """Remove every `ggml_add_cpu_backend_variant(<name> ... AMX_* ...)` call from ggml/src/CMakeLists.txt
    (sapphirerapids in llama.cpp of 0.3.36): the patched text and the names removed. Exits when the
    file defines no variants at all (llama.cpp moved the list: the patch must be looked at again)."""
    calls = _VARIANT_CALL.findall(cmakelists)
    if not calls:
        sys.exit(f"llama_build: no ggml_add_cpu_backend_variant(...) call in {VARIANTS_CMAKELISTS}; "
                 "cannot leave the AMX variants out")
    dropped = [name for name, feats in calls if "AMX_" in feats]
    patched = _VARIANT_CALL.sub(lambda m: "" if "AMX_" in m.group(2) else m.group(0), cmakelists)
    return patched, dropped


def portable_source(python: str, version: str, workdir: Path) -> Path:
    """llama-cpp-python's sdist (pip download), unpacked in `workdir` with the AMX variants removed."""
    subprocess.run([python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-cache-dir",
                    "-d", str(workdir), f"llama-cpp-python=={version}"], check=True)
    tarballs = sorted(workdir.glob("llama_cpp_python-*.tar.gz"))
    if not tarballs:
        sys.exit(f"llama_build: pip download left no sdist in {workdir}")
    with tarfile.open(tarballs[-1]) as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4: refuse links and paths out of workdir
            tar.extractall(workdir, filter="data")
        else:
            tar.extractall(workdir)
    src = workdir / f"llama_cpp_python-{version}"
    cmakelists = src / VARIANTS_CMAKELISTS
    patched, dropped = drop_amx_variants(cmakelists.read_text())
    cmakelists.write_text(patched)
    print(f"llama_build: portable build leaves out the AMX CPU variants: {', '.join(dropped) or 'none defined'}",
          flush=True)
    return src


def cache_dir() -> Path:
    base = os.environ.get("LLAMARAY_WHEEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llamaray", "wheels")
    return Path(base)


def ensure_wheel(python: str, env: dict[str, str], version: str, key: str) -> Path:
    """The wheel for `key`, built now (pip wheel, no pip cache) if the cache lacks it."""
    target = cache_dir() / key
    found = sorted(target.glob("llama_cpp_python-*.whl"))
    if found:
        return found[-1]
    minutes = "~20 min (every CPU variant)" if is_portable(env) else "~5 min"
    print(f"llama_build: compiling llama-cpp-python=={version} ({env}); {minutes} on 2 cores", flush=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        source = (str(portable_source(python, version, Path(tmp) / "src")) if is_portable(env)
                  else f"llama-cpp-python=={version}")
        subprocess.run(
            [python, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "--no-binary", "llama-cpp-python",
             "-w", tmp, source],
            env={**os.environ, **env}, check=True)
        wheels = sorted(Path(tmp).glob("llama_cpp_python-*.whl"))
        if not wheels:
            sys.exit(f"llama_build: pip wheel left no wheel in {tmp}")
        staged = Path(tmp) / "out"
        staged.mkdir()
        shutil.move(str(wheels[-1]), staged / wheels[-1].name)
        staged.rename(target)  # atomic: a half-built wheel never sits under the key
    return next(target.glob("llama_cpp_python-*.whl"))


def install(python: str, cuda: bool, cuda_arch: str | None, portable: bool = False) -> None:
    version = pinned_version()
    env = build_env(cuda, cuda_arch, portable)
    key = build_key(env, version)
    prefix = subprocess.run([python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True,
                            check=True).stdout.strip()
    record_path = Path(prefix) / BUILD_RECORD
    try:
        installed = json.loads(record_path.read_text()).get("key")
    except (OSError, ValueError):
        installed = None
    if installed == key:
        print(f"llama_build: llama-cpp-python build {key} already installed in {prefix}")
        return
    wheel = ensure_wheel(python, env, version, key)
    subprocess.run([python, "-m", "pip", "install", "--no-deps", "--force-reinstall", str(wheel)], check=True)
    # A portable build records no CPU flags: there is no build CPU for another one to lack.
    record = {"key": key, "version": version, "env": env, "compiler": compiler_version(),
              "machine": platform.machine(), "portable": portable,
              "cpu_flags": [] if portable else cpu_flags(), "wheel": str(wheel)}
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"llama_build: installed {wheel.name} (build {key}) into {prefix}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--key", action="store_true", help="print this machine's build key and exit")
    ap.add_argument("--env", action="store_true", help="print the build's environment (JSON) and exit")
    ap.add_argument("--wheel", action="store_true", help="build the wheel into the cache if missing; print its path")
    ap.add_argument("--install", metavar="PYTHON", help="install the build into this interpreter's environment")
    ap.add_argument("--cuda", action="store_true", help="build with the CUDA backend (GPU nodes)")
    ap.add_argument("--cuda-arch", help="CMAKE_CUDA_ARCHITECTURES, e.g. 86 (A10G), 89 (L4), 90 (H100/H200); "
                    f"a list like {PORTABLE_CUDA_ARCHS!r} (the --portable default)")
    ap.add_argument("--portable", action="store_true",
                    help="every CPU variant, chosen at run time (container images), instead of -march=native")
    args = ap.parse_args(argv)
    cuda = args.cuda or os.environ.get("LLAMARAY_CUDA", "") in ("1", "on", "true")
    env = build_env(cuda, args.cuda_arch, args.portable)
    if args.key:
        print(build_key(env, pinned_version()))
    elif args.env:
        print(json.dumps(env))
    elif args.wheel:
        version = pinned_version()
        print(ensure_wheel(sys.executable, env, version, build_key(env, version)))
    elif args.install:
        install(args.install, cuda, args.cuda_arch, args.portable)
    else:
        ap.print_help()


if __name__ == "__main__":
    main()
