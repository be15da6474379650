"""Startup self-check: load the model and decode once in a child process before the replica serves.

A native crash in llama.cpp (an AMX kernel, an instruction this CPU lacks, a broken GPU build) kills the
process that runs it. Run in the replica, that is a replica Serve restarts forever, each request a 503
with no reason given. Run here first, the crash kills only the child; the replica stays up and says why,
in its log and in /health.

    python -m app.engine.selfcheck < params.json     # the child; prints one JSON line

The pipe carries our own values (paths, counts, llama.cpp's system info), no client's or model's text: the
standard library's JSON, not the API's strict reader (app/api/strict_json.py), which sits above the engine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..config.spec import ModelSpec, place
from . import hardware

TIMEOUT_S = 600.0
_APP_ROOT = str(Path(__file__).resolve().parents[2])
# Checks this process has seen pass, by what the child was given and the file's identity. A pool loads the same
# GGUF again after each eviction; the check is about this machine's llama.cpp and that file, neither of which
# changed, and its child (a second load and a decode) costs more than the load it guards.
_passed: dict[tuple[Any, ...], dict[str, Any]] = {}


class EngineUnavailable(RuntimeError):
    """The model cannot run in this process; the message says why and what to do."""


def _child_params(spec: ModelSpec) -> dict[str, Any]:
    spec = place(spec)
    return {"path": spec.path, "n_gpu_layers": spec.n_gpu_layers, "n_threads": spec.n_threads,
            "cpu_extra_buffers": spec.cpu_extra_buffers, "pooling": spec.pooling or None,
            "kv_types": [spec.cache_type_k, spec.cache_type_v]}


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def _check_key(spec: ModelSpec) -> tuple[Any, ...] | None:
    try:
        st = os.stat(spec.path)
    except OSError:
        return None
    return (json.dumps(_child_params(spec), sort_keys=True), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def self_check_once(spec: ModelSpec, run: Any = None) -> dict[str, Any]:
    """`run_self_check(spec)`, unless the same check of the same file passed in this process before (its report
    then). A failure is never remembered: the next load checks again."""
    key = _check_key(spec)
    if key is not None and key in _passed:
        return _passed[key]
    report = (run or run_self_check)(spec)
    if key is not None:
        _passed[key] = report
    return report


def run_self_check(spec: ModelSpec, timeout_s: float = TIMEOUT_S, command: list[str] | None = None) -> dict[str, Any]:
    """Load `spec`'s model and decode one token in a child; its report, or EngineUnavailable.
    `command` replaces the child (tests give it one that crashes)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_APP_ROOT, os.environ.get("PYTHONPATH")]))}
    command = command or [sys.executable, "-m", "app.engine.selfcheck"]
    try:
        proc = subprocess.run(command, input=json.dumps(_child_params(spec), ensure_ascii=True),
                              capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise EngineUnavailable(f"model {spec.id!r}: llama.cpp did not load and decode once within {timeout_s:.0f} s "
                                f"in the startup self-check. {hardware.describe()}") from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    for line in lines:  # llama.cpp refused the file itself: that is the cause, not this machine
        if line.startswith("{") and '"load_error"' in line:
            raise EngineUnavailable(f"model {spec.id!r}: {json.loads(line)['load_error']}")
    how = (f"killed by {_signal_name(proc.returncode)}" if proc.returncode < 0
           else f"exit status {proc.returncode}")
    info = backend = None
    for line in lines:  # the child prints llama.cpp's system info before it loads anything
        if line.startswith("{") and '"system_info"' in line:
            first = json.loads(line)
            info, backend = first.get("system_info"), first.get("cpu_backend")
    tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
    hints = hardware.crash_hints(info)
    raise EngineUnavailable(
        f"model {spec.id!r}: the startup self-check (load {Path(spec.path).name}, decode one token) failed "
        f"({how}), so this replica does not run it. "
        + (f"Likely cause: {'; '.join(hints)}. " if hints else "")
        + f"{hardware.describe(info, backend)}." + (f" Last output: {tail}" if tail else ""))


def _child() -> None:
    from .llama import Batch, LlamaModelContext, ModelLoadError, embed_batch, greedy_token

    params = json.loads(sys.stdin.read())
    info = hardware.system_info()
    backend = hardware.cpu_backend()
    extra = hardware.use_extra_buffers(params["cpu_extra_buffers"], info)
    # survives a crash below
    print(json.dumps({"system_info": info, "cpu_backend": backend}, ensure_ascii=True), flush=True)
    try:
        llama = LlamaModelContext(params["path"], n_ctx_per_seq=256, n_seq_max=1, n_batch=64,
                                  n_threads=params["n_threads"], n_threads_batch=params["n_threads"],
                                  n_gpu_layers=params["n_gpu_layers"], kv_unified=True, extra_buffers=extra,
                                  pooling=params.get("pooling"), type_k=params["kv_types"][0],
                                  type_v=params["kv_types"][1])
    except ModelLoadError as exc:
        print(json.dumps({"load_error": str(exc)}, ensure_ascii=True), flush=True)
        sys.exit(1)
    try:
        if params.get("pooling"):  # an embedding model: pool one input instead of sampling a token
            tokens = llama.tokenize("Hello", add_special=True, parse_special=False)
            batch = Batch(len(tokens))
            for pos, tok in enumerate(tokens):
                batch.add(tok, pos, 0, True)
            vectors = embed_batch(llama, batch, 1)
            batch.free()
            if vectors is None:
                raise RuntimeError("llama_decode failed on the self-check input")
            token = 0
        else:
            token = greedy_token(llama, llama.tokenize("Hello"))
    finally:
        llama.close()
    print(json.dumps({"ok": True, "system_info": info, "cpu_backend": backend, "extra_buffers": extra,
                      "token": token}, ensure_ascii=True), flush=True)


if __name__ == "__main__":
    _child()
