"""Where the ledger's usage and budgets outlive it: a JSON file, local (written atomically: a crash mid-write
leaves the previous one) or any fsspec URL (`s3://bucket/llamaray/usage.json`), so that an actor restarted on
another node finds it."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Any

import fsspec

log = logging.getLogger("llamaray.tenants")


def load_snapshot(url: str) -> dict[str, Any]:
    """The last snapshot saved at `url`; empty when there is none or it cannot be read (usage then starts
    anew, said in the log, rather than the ledger refusing to start)."""
    try:
        with fsspec.open(os.path.expanduser(url), "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.error("tenant usage snapshot %s could not be read, usage starts anew: %r", url, exc)
        return {}
    return data if isinstance(data, dict) else {}


def save_snapshot(url: str, data: dict[str, Any]) -> None:
    blob = json.dumps(data, separators=(",", ":"), allow_nan=False).encode()
    fs, path = fsspec.core.url_to_fs(os.path.expanduser(url))
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    if "file" in protocols:
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".usage-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        return
    with fs.open(path, "wb") as f:  # object stores replace an object whole
        f.write(blob)
