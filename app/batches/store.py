"""Where batch files, batch state and results are kept: an fsspec URL (a local directory by default; S3, GCS or any
filesystem every node reaches on a cluster). Every object is written whole or not at all: a small one atomically
(a local file through a temporary name and a rename; an object store's put replaces an object whole), a large one
(an upload, an output file) streamed to its place and made visible only by the small record written after it.

Layout (an owner is a key's digest, app/batches/ids.py):

    keys/<owner>/files/<file id>.json          a file's record (FileRecord)
    keys/<owner>/files/<file id>.data          its bytes
    keys/<owner>/batches/<batch id>/record.json    the batch (BatchRecord), written by whoever owns it at the time
    keys/<owner>/batches/<batch id>/index.bin      its lines' places and prefixes (validation.py)
    keys/<owner>/batches/<batch id>/input.jsonl    a Message Batch's requests, as lines
    keys/<owner>/batches/<batch id>/results/...    its results, in chunks (results.py)
    keys/<owner>/batches/<batch id>/cancel         asked to cancel
    open/<owner>.<batch id>                    a batch not yet ended (what a runner resumes)
    ids/<id>                                   an id's owner (what an admin key's lookups read)

Only ids this server made reach a path (ids.py checks them first), so no request names a path of its own."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import suppress
from typing import Any, BinaryIO

import fsspec

STORAGE_ENV = "LLAMARAY_BATCH_STORAGE"
DEFAULT_STORAGE = "~/.cache/llamaray/batches"


def storage_url(configured: str | None) -> str:
    """The store's URL: the config's `batch.storage`, else $LLAMARAY_BATCH_STORAGE, else the user's cache."""
    return configured or os.environ.get(STORAGE_ENV) or DEFAULT_STORAGE


class StreamWriter:
    """One object written in pieces: visible at `commit`, gone at `abort` (or never there)."""

    def __init__(self, store: "BatchStore", path: str) -> None:
        self.store, self.path, self.size = store, path, 0
        if store.local:
            directory = os.path.dirname(store.full(path))
            os.makedirs(directory, exist_ok=True)
            fd, self._tmp = tempfile.mkstemp(dir=directory, prefix=".part-")
            self._f: Any = os.fdopen(fd, "wb")
        else:
            self._tmp = None
            self._f = store.fs.open(store.full(path), "wb")

    def write(self, data: bytes) -> None:
        self._f.write(data)
        self.size += len(data)

    def commit(self) -> None:
        if self._tmp is not None:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            os.replace(self._tmp, self.store.full(self.path))
        else:
            self._f.close()  # an object store's multipart upload completes here

    def abort(self) -> None:
        if self._tmp is not None:
            self._f.close()
            with suppress(OSError):
                os.unlink(self._tmp)
            return
        discard = getattr(self._f, "discard", None)
        if discard is not None:
            discard()  # fsspec's buffered files: the upload is dropped, nothing committed
        else:
            with suppress(Exception):
                self._f.close()
            self.store.delete(self.path)


class BatchStore:
    """The store at `url` (blocking calls: the async callers run them in threads)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.fs, root = fsspec.core.url_to_fs(os.path.expanduser(url))
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        self.local = "file" in protocols or "local" in protocols
        self.root = root.rstrip("/")
        if self.local:
            os.makedirs(self.root, exist_ok=True)

    def full(self, path: str) -> str:
        return f"{self.root}/{path}"

    # -- whole objects ------------------------------------------------------------------------------------------
    def put(self, path: str, data: bytes) -> None:
        """`data` at `path`, replacing what was there at once: a reader sees the old object or the new one."""
        if not self.local:
            self.fs.pipe_file(self.full(path), data)
            return
        writer = StreamWriter(self, path)
        try:
            writer.write(data)
            writer.commit()
        except BaseException:
            writer.abort()
            raise

    def get(self, path: str) -> bytes | None:
        try:
            return self.fs.cat_file(self.full(path))
        except FileNotFoundError:
            return None

    def exists(self, path: str) -> bool:
        return self.fs.exists(self.full(path))

    def delete(self, path: str, recursive: bool = False) -> None:
        with suppress(FileNotFoundError):
            self.fs.rm(self.full(path), recursive=recursive)

    def names(self, folder: str) -> list[str]:
        """The names in `folder` (none when it does not exist), temporary files left out."""
        try:
            entries = self.fs.ls(self.full(folder), detail=False)
        except FileNotFoundError:
            return []
        names = (e.rstrip("/").rsplit("/", 1)[-1] for e in entries)
        return sorted(n for n in names if not n.startswith(".part-"))

    def sizes(self, folder: str) -> dict[str, int]:
        """Each object's size in `folder`, from one listing."""
        try:
            entries = self.fs.ls(self.full(folder), detail=True)
        except FileNotFoundError:
            return {}
        return {e["name"].rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0) for e in entries
                if e.get("type") != "directory"}

    # -- streams ------------------------------------------------------------------------------------------------
    def writer(self, path: str) -> StreamWriter:
        return StreamWriter(self, path)

    def reader(self, path: str) -> BinaryIO:
        """`path` opened for reading (seekable: a line is read at its offset). FileNotFoundError when absent."""
        return self.fs.open(self.full(path), "rb")

    def blocks(self, path: str, size: int = 1 << 20) -> Iterator[bytes]:
        with self.reader(path) as f:
            while block := f.read(size):
                yield block
