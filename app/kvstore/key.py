"""What makes a saved sequence state valid in another context, as digests that name the directories entries live in.

A state is llama.cpp's serialization of one sequence's KV cells. It is only meaningful for the same weights (the
GGUF's content, not its path: a file copied elsewhere is the same model, a re-quantized one under the same name is
not), the same KV types and context size, the same llama.cpp (its state format and kernels), and, per entry, the
same adapters at the same scales and the same cache scope (one key's prompts never serve another's:
app/generation/caller.py `cache_scope`). The model-wide part is the `StoreKey`; the per-request part the scope
digest. Both are hex digests computed here: nothing a client sends becomes a path."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

FORMAT = 1  # the entry format (entry.py); part of the key, so a new format never reads an old entry


@dataclass(frozen=True)
class StoreKey:
    model: str      # the GGUF's sha256 (of its first part, for a split model)
    engine: str     # the llama.cpp build that wrote the state (llama-cpp-python's version and its build flags)
    n_ctx: int      # context per sequence
    type_k: str     # KV cache types (f16, q8_0, q4_0)
    type_v: str
    flash_attn: str  # how V is laid out follows from it

    def digest(self) -> str:
        text = json.dumps({"format": FORMAT, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def scope_digest(cache_scope: str, adapters: tuple[tuple[str, float], ...] = ()) -> str:
    """The directory of a cache scope's entries: the caller's scope (already a digest of its key and salt) and the
    adapters it decodes under, by their files' content and their scales."""
    text = json.dumps([cache_scope, [[a, float(s)] for a, s in adapters if s != 0]])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


_lock = threading.Lock()
_known: dict[tuple[str, int, int, int], str] = {}


def file_sha256(path: str, cache_dir: str | None = None) -> str:
    """A file's sha256, remembered by (path, size, mtime, inode) in this process and in `cache_dir` (a sidecar per
    file version), so a node reads each model file once, not at every replica's start."""
    st = os.stat(path)
    version = (os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino)
    with _lock:
        if version in _known:
            return _known[version]
    sidecar = None
    if cache_dir:
        name = hashlib.sha256(json.dumps(version).encode()).hexdigest()[:32]
        sidecar = Path(cache_dir) / "identities" / f"{name}.sha256"
        try:
            digest = sidecar.read_text().strip()
            if len(digest) == 64:
                with _lock:
                    _known[version] = digest
                return digest
        except OSError:
            pass
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    digest = h.hexdigest()
    with _lock:
        _known[version] = digest
    if sidecar is not None:
        try:
            sidecar.parent.mkdir(parents=True, exist_ok=True)
            tmp = sidecar.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(digest)
            os.replace(tmp, sidecar)
        except OSError:
            pass  # a read-only cache: the hash is computed again next time
    return digest
