"""The test-model cache's one way to build a file once: under a file lock, to a temporary name then renamed, so
concurrent test runs never read half a file (tools/fim_gguf.py, tools/colour_mmproj.py, tools/minilm_gguf.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def cached_build(directory: Path, name: str, build: Callable[[Path], None]) -> Path:
    """`directory / name`, written by build(path) on first use."""
    from filelock import FileLock

    out = directory / name
    if out.is_file():
        return out
    directory.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if not out.is_file():
            tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
            try:
                build(tmp)
                tmp.replace(out)
            finally:
                tmp.unlink(missing_ok=True)
    return out
