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

The installed build is recorded in `<venv>/llamaray-build.json`; the engine reads it to explain a
crash (built on another CPU, built without our flags). Standard library only: it runs before the venv
has anything in it.

    python tools/llama_build.py --key                    # the cache key of this machine's build
    python tools/llama_build.py --install .venv/bin/python [--cuda [--cuda-arch 86]]
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
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD_RECORD = "llamaray-build.json"
# AMX compiled out; everything else -march=native picks stays on.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


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


def build_env(cuda: bool, cuda_arch: str | None) -> dict[str, str]:
    """CMAKE_ARGS / CFLAGS / CXXFLAGS for this machine's build (also used for llama-server)."""
    cmake = ["-DGGML_NATIVE=ON"]
    if cuda:
        cmake.append("-DGGML_CUDA=on")
        if cuda_arch:
            cmake.append(f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}")
    env = {"CMAKE_ARGS": " ".join(cmake)}
    if is_x86():
        env["CFLAGS"] = env["CXXFLAGS"] = NO_AMX
    return env


def build_key(env: dict[str, str], version: str) -> str:
    parts = [version, json.dumps(env, sort_keys=True), compiler_version(), platform.machine(), *cpu_flags()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


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
    print(f"llama_build: compiling llama-cpp-python=={version} ({env}); ~5 min on 2 cores", flush=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        subprocess.run(
            [python, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "--no-binary", "llama-cpp-python",
             "-w", tmp, f"llama-cpp-python=={version}"],
            env={**os.environ, **env}, check=True)
        wheels = sorted(Path(tmp).glob("llama_cpp_python-*.whl"))
        if not wheels:
            sys.exit(f"llama_build: pip wheel left no wheel in {tmp}")
        staged = Path(tmp) / "out"
        staged.mkdir()
        shutil.move(str(wheels[-1]), staged / wheels[-1].name)
        staged.rename(target)  # atomic: a half-built wheel never sits under the key
    return next(target.glob("llama_cpp_python-*.whl"))


def install(python: str, cuda: bool, cuda_arch: str | None) -> None:
    version = pinned_version()
    env = build_env(cuda, cuda_arch)
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
    record = {"key": key, "version": version, "env": env, "compiler": compiler_version(),
              "machine": platform.machine(), "cpu_flags": cpu_flags(), "wheel": str(wheel)}
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"llama_build: installed {wheel.name} (build {key}) into {prefix}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--key", action="store_true", help="print this machine's build key and exit")
    ap.add_argument("--env", action="store_true", help="print the build's environment (JSON) and exit")
    ap.add_argument("--install", metavar="PYTHON", help="install the build into this interpreter's environment")
    ap.add_argument("--cuda", action="store_true", help="build with the CUDA backend (GPU nodes)")
    ap.add_argument("--cuda-arch", help="CMAKE_CUDA_ARCHITECTURES, e.g. 86 (A10G), 89 (L4), 90 (H100/H200)")
    args = ap.parse_args(argv)
    cuda = args.cuda or os.environ.get("LLAMARAY_CUDA", "") in ("1", "on", "true")
    env = build_env(cuda, args.cuda_arch)
    if args.key:
        print(build_key(env, pinned_version()))
    elif args.env:
        print(json.dumps(env))
    elif args.install:
        install(args.install, cuda, args.cuda_arch)
    else:
        ap.print_help()


if __name__ == "__main__":
    main()
