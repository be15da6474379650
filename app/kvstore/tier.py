"""Where entries are kept: the node's disk (`DiskTier`, a bounded directory, least recently used out) and a store the
cluster shares (`StoreTier`, any fsspec URL: s3://, gs://, a shared filesystem). The same layout in both:
`<root>/<model key>/<scope>/<name>.kv` and `.idx` (entry.py).

A write never leaves half an entry where a reader looks: on a filesystem, each file is written under a temporary
name and renamed into place, the payload before its index record; on an object store, each object is one put
(atomic per object), the payload first. Several replicas writing the same entry write the same bytes under the same
name. A reader that meets a truncated, corrupted or foreign entry removes it (entry.py says what is checked)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .entry import EntryError, IndexRecord, check_payload, decode_index, encode_index

KV, IDX = ".kv", ".idx"


class DiskTier:
    """`root` on this node: entries of every model, each model's bounded to `max_bytes` (its payloads), least
    recently used out (a read touches an entry's payload)."""

    name = "disk"

    def __init__(self, root: str | Path, max_bytes: int) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes

    def _dir(self, key: str, scope: str) -> Path:
        return self.root / key / scope

    def scan(self, key: str, known: set[str] = frozenset()) -> Iterator[tuple[str, IndexRecord | None]]:
        """(name, record) of every usable entry of model `key`; the record None for a name in `known` (not read
        again). Unusable entries are removed as they are met."""
        base = self.root / key
        if not base.is_dir():
            return
        for scope_dir in base.iterdir():
            if not scope_dir.is_dir():
                continue
            for idx in scope_dir.glob(f"*{IDX}"):
                name = idx.name[:-len(IDX)]
                if name in known:
                    yield name, None
                    continue
                try:
                    record = decode_index(idx.read_bytes(), key, scope_dir.name)
                except (OSError, EntryError):
                    self._remove_files(idx.with_suffix(""))
                    continue
                if (scope_dir / f"{record.name}{KV}").is_file():
                    yield name, record
                else:
                    self._remove_files(idx.with_suffix(""))  # a record whose payload is gone

    def read(self, record: IndexRecord) -> bytes:
        path = self._dir(record.key, record.scope) / f"{record.name}{KV}"
        try:
            payload = path.read_bytes()
            check_payload(record, payload)
        except (OSError, EntryError):
            self.remove(record)
            raise
        try:
            os.utime(path)  # recently used
        except OSError:
            pass
        return payload

    def write(self, record: IndexRecord, payload: bytes | memoryview) -> None:
        folder = self._dir(record.key, record.scope)
        folder.mkdir(parents=True, exist_ok=True)
        stem = folder / record.name
        _atomic_write(stem.with_name(record.name + KV), payload)
        _atomic_write(stem.with_name(record.name + IDX), encode_index(record))

    def remove(self, record: IndexRecord) -> None:
        self._remove_files(self._dir(record.key, record.scope) / record.name)

    @staticmethod
    def _remove_files(stem: Path) -> None:
        for suffix in (IDX, KV):
            try:
                stem.with_name(stem.name + suffix).unlink()
            except OSError:
                pass

    def used(self, key: str) -> list[tuple[float, int, Path]]:
        """(last used, bytes, path) of each payload of model `key`."""
        out = []
        base = self.root / key
        if base.is_dir():
            for payload in base.glob(f"*/*{KV}"):
                try:
                    st = payload.stat()
                except OSError:
                    continue
                out.append((st.st_mtime, st.st_size, payload))
        return out

    def evict(self, key: str) -> list[str]:
        """Least recently used entries of model `key` out until its payloads fit `max_bytes`; their names."""
        entries = sorted(self.used(key))
        total = sum(size for _, size, _ in entries)
        gone = []
        for _, size, payload in entries:
            if total <= self.max_bytes:
                break
            self._remove_files(payload.with_suffix(""))
            total -= size
            gone.append(payload.stem)
        return gone


class StoreTier:
    """Entries in an fsspec store that every replica of the cluster reads (`url`: s3://bucket/prefix, gs://...,
    file:///shared/nfs/path, memory:// in tests)."""

    name = "cluster"

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        import fsspec

        self.url = url.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **(storage_options or {}))
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))

    def _path(self, key: str, scope: str, name: str, suffix: str) -> str:
        return f"{self.root}/{key}/{scope}/{name}{suffix}"

    def scan(self, key: str, known: set[str] = frozenset()) -> Iterator[tuple[str, IndexRecord | None]]:
        """As DiskTier.scan: one listing, and a read of each record not `known` (a store's rescan costs a GET per new
        entry, not per entry)."""
        try:
            paths = self.fs.glob(f"{self.root}/{key}/*/*{IDX}")
        except FileNotFoundError:
            return
        for path in paths:
            scope, name = path.rsplit("/", 2)[-2], path.rsplit("/", 1)[-1][:-len(IDX)]
            if name in known:
                yield name, None
                continue
            try:
                record = decode_index(self.fs.cat_file(path), key, scope)
            except FileNotFoundError:
                continue  # removed meanwhile
            except EntryError:
                self._remove(path[:-len(IDX)])
                continue
            yield name, record

    def read(self, record: IndexRecord) -> bytes:
        try:
            payload = self.fs.cat_file(self._path(record.key, record.scope, record.name, KV))
            check_payload(record, payload)
        except EntryError:
            self.remove(record)
            raise
        return payload

    def write(self, record: IndexRecord, payload: bytes | memoryview) -> None:
        for suffix, data in ((KV, bytes(payload)), (IDX, encode_index(record))):
            path = self._path(record.key, record.scope, record.name, suffix)
            if self.local:
                self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
                tmp = f"{path}.{uuid.uuid4().hex}.tmp"
                self.fs.pipe_file(tmp, data)
                self.fs.mv(tmp, path)
            else:
                self.fs.pipe_file(path, data)

    def remove(self, record: IndexRecord) -> None:
        self._remove(self._path(record.key, record.scope, record.name, ""))

    def _remove(self, stem: str) -> None:
        for suffix in (IDX, KV):
            try:
                self.fs.rm_file(stem + suffix)
            except (FileNotFoundError, OSError):
                pass


def _atomic_write(path: Path, data: bytes | memoryview) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
