"""Each node's model cache: where fetched files live, the lock that makes replicas on one node fetch a
file once, and the free-space check before a download starts."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from urllib.parse import urlsplit

from filelock import FileLock

from .redact import without_userinfo

CACHE_ENV = "LLAMARAY_MODEL_CACHE"
DEFAULT_CACHE = "~/.cache/llamaray/models"
# Room left after a download: a full disk breaks more than this replica (logs, Ray's object spill).
FREE_MARGIN_BYTES = 1 << 30
FREE_MARGIN_SHARE = 0.05


class DiskFull(OSError):
    """Not enough free space for a download; the message gives both figures."""


def cache_root(setting: str | None = None) -> Path:
    """$LLAMARAY_MODEL_CACHE (each node's own environment), else the `model_cache` setting, else
    ~/.cache/llamaray/models: a place that outlives Ray sessions, so a restart does not fetch again."""
    raw = os.environ.get(CACHE_ENV) or setting or DEFAULT_CACHE
    return Path(os.path.expandvars(os.path.expanduser(raw))).resolve()


def hub_cache(root: Path) -> Path:
    """huggingface_hub's cache layout (blobs, snapshots) under ours: its resumable downloads and reuse."""
    return root / "hub"


def url_dir(root: Path, url: str) -> Path:
    """The folder of a URL's file in the cache: one per remote folder, so the parts of a split model
    sit side by side under their own names, as llama.cpp expects. Named without the URL's credentials
    (they would show in every path, log and listing): the same object whatever the credentials."""
    url = without_userinfo(url)
    parts = urlsplit(url)
    folder = url.rsplit("/", 1)[0]
    digest = hashlib.sha256(folder.encode()).hexdigest()[:16]
    host = "".join(c if c.isalnum() or c in "-." else "_" for c in parts.netloc) or "host"
    return root / parts.scheme / host / digest


def lock(root: Path, key: str) -> FileLock:
    """The node-wide lock of one source (`key`): held while it is fetched and checked."""
    folder = root / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    return FileLock(str(folder / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".lock")))


def needed_bytes(size: int) -> int:
    return size + max(FREE_MARGIN_BYTES, int(size * FREE_MARGIN_SHARE))


def check_free_space(folder: Path, size: int, *, free: int | None = None) -> None:
    """DiskFull unless `folder`'s file system has room for `size` bytes plus a margin (`free`: the
    free bytes, measured when not given)."""
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free if free is None else free
    need = needed_bytes(size)
    if free < need:
        raise DiskFull(f"disk full: {folder} has {human_size(free)} free, the download needs {human_size(size)} plus "
                       f"{human_size(need - size)} to spare")


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"

