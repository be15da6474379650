"""What this process runs on: the CPU's features, the llama.cpp build, and whether they fit together.

llama.cpp's AMX kernels crash on some AMX CPUs (llama.cpp #20824). `tools/llama_build.py` compiles them
out; a llama-cpp-python installed some other way (plain `pip install` on an AMX machine) still has them,
and then `use_extra_bufts=False` keeps the weights out of the AMX buffer, so those kernels never run.
No llama_cpp import at module level: the self-check's parent reads these facts without loading it.
"""

from __future__ import annotations

import json  # the build record is our own file (tools/llama_build.py): no client text, no strict reader needed
import platform
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

BUILD_RECORD = Path(sys.prefix) / "llamaray-build.json"
AMX_CPU_FLAGS = ("amx_tile", "amx_int8", "amx_bf16")
# The features -march=native turns into kernels; a build from a CPU with more of them SIGILLs here.
ISA_FLAGS = ("avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_bf16", "avx512vbmi", "avx_vnni", *AMX_CPU_FLAGS)


@lru_cache(maxsize=1)
def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    match = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", _cpuinfo(), re.MULTILINE)
    return frozenset(match.group(1).split()) if match else frozenset()


@lru_cache(maxsize=1)
def cpu_name() -> str:
    match = re.search(r"^model name\s*:\s*(.*)$", _cpuinfo(), re.MULTILINE)
    return match.group(1).strip() if match else platform.processor() or platform.machine()


def cpu_has_amx(flags: frozenset[str] | None = None) -> bool:
    return any(f in (cpu_flags() if flags is None else flags) for f in AMX_CPU_FLAGS)


def build_record() -> dict[str, Any] | None:
    """How tools/llama_build.py built the installed llama-cpp-python, or None (installed otherwise)."""
    try:
        return json.loads(BUILD_RECORD.read_text())
    except (OSError, ValueError):
        return None


def system_info() -> str:
    """llama.cpp's own summary of the loaded library: backends and the CPU kernels compiled in (in a
    build of runtime-loaded backends, those of the variant chosen for this CPU: loaded first)."""
    import llama_cpp as L

    from .llama import init_backend

    init_backend()
    return L.llama_print_system_info().decode("utf-8", errors="replace").strip()


def cpu_backend() -> str:
    """The CPU kernels this process runs: the variant ggml chose at run time (a portable build:
    "haswell", "zen4", ...) or "linked in" (a build for one CPU)."""
    from .llama import cpu_backend as chosen

    return chosen()


def build_has_amx(info: str) -> bool:
    """True when the loaded ggml-cpu was compiled with AMX kernels (`AMX_INT8 = 1` in system info)."""
    return re.search(r"\bAMX_INT8 = 1\b", info) is not None


def use_extra_buffers(setting: str, info: str, flags: frozenset[str] | None = None) -> bool:
    """llama_model_params.use_extra_bufts for `cpu_extra_buffers: auto|on|off`.

    Extra buffer types hold repacked weights (faster CPU kernels) and, in an AMX build, the AMX
    buffer. `auto` keeps them unless the build has AMX kernels and this CPU would run them."""
    if setting in ("on", "off"):
        return setting == "on"
    return not (build_has_amx(info) and cpu_has_amx(flags))


def missing_isa(record: dict[str, Any] | None, flags: frozenset[str] | None = None) -> list[str]:
    """Instruction sets the build machine had and this CPU lacks (a -march=native build copied here)."""
    if not record or not record.get("cpu_flags"):
        return []
    here = cpu_flags() if flags is None else flags
    if not here:
        return []
    built = set(record["cpu_flags"])
    return sorted(f for f in ISA_FLAGS if f in built and f not in here)


def describe(info: str | None = None, backend: str | None = None) -> str:
    """One paragraph for logs and /health: CPU, its notable features, the llama.cpp build and, when
    known (`backend`: cpu_backend() of the process that loaded llama.cpp), which CPU kernels run."""
    flags = cpu_flags()
    notable = ",".join(f for f in ISA_FLAGS if f in flags) or "none detected"
    record = build_record()
    build = (f"llama-cpp-python {record.get('version')} built by tools/llama_build.py ({record.get('env')})"
             if record else "llama-cpp-python not built by tools/llama_build.py (its own default flags)")
    text = f"CPU: {cpu_name()} [{notable}]; {build}"
    if backend:
        text += f"; CPU backend: {backend}" + (" (variant chosen at run time)" if backend != "linked in" else "")
    if info:
        text += f"; llama.cpp: {info}"
    return text


def crash_hints(info: str | None) -> list[str]:
    """Known causes of a native crash at load or first decode, most likely first."""
    hints = []
    if info and build_has_amx(info) and cpu_has_amx():
        hints.append("this llama.cpp has AMX kernels and this CPU has AMX: they crash on some AMX CPUs "
                     "(llama.cpp #20824); reinstall with `make install` (tools/llama_build.py compiles AMX "
                     "out) or set `cpu_extra_buffers: off` for this model")
    lacking = missing_isa(build_record())
    if lacking:
        hints.append(f"this llama.cpp was compiled on a CPU with {', '.join(lacking)} that this CPU lacks: "
                     "rebuild it here (`make install`), or for images use the portable build "
                     "(tools/llama_build.py --portable: every CPU variant, chosen at run time)")
    return hints


def spare_core_for_masks(spec: Any) -> bool:
    """Whether a constrained step's grammar masks can be computed beside its decode without slowing it: the
    model decodes on a GPU, or its decode threads leave a core of this process's free."""
    import os

    import llama_cpp as L

    if spec.n_gpu_layers and L.llama_supports_gpu_offload():
        return True
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(spec.n_threads, spec.n_threads_batch) < cores
