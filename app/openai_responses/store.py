"""Where stored responses live (`store: true`, the Responses API's default): kept so that
`previous_response_id` continues a conversation and `GET /v1/responses/{id}` returns it.

An entry is a JSON-able dict (the response object and what a follow-up turn needs); `owner` is the
caller's key id (app/serving/caller.py), and an entry is only ever returned to its owner.

`BoundedResponseStore` keeps entries in memory within three bounds (app/config/settings.py, `Limits`):
how many, how many bytes (an entry's compact JSON encoding), and how long (`ttl_s` from its last write).
Past a bound the least recently written or read entries go first. An entry larger than the whole byte
bound is not kept: its response was generated and is still returned to the client (a user who sent a big
request wants its answer more than a later continuation of it), so `store` is honoured on a best-effort
basis, as it is for any entry evicted later; `put` returns False and the store logs one line.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..config.settings import Limits

log = logging.getLogger("llamaray.responses")

Key = tuple[str | None, str]


class ResponseStore(Protocol):
    async def put(self, owner: str | None, response_id: str, entry: dict[str, Any]) -> bool:
        """Keep `entry` (replacing the owner's entry of that id). False: not kept (larger than the store's
        byte bound, or storing is off); nothing of that id is kept then."""

    async def get(self, owner: str | None, response_id: str) -> dict[str, Any] | None:
        """The entry, or None: unknown, expired, or another owner's (indistinguishable on purpose)."""

    async def delete(self, owner: str | None, response_id: str) -> bool:
        """True: the owner's entry was there and is gone; False as for `get`'s None."""


def encode_entry(entry: dict[str, Any]) -> bytes:
    """An entry as it is kept and measured: compact JSON, UTF-8."""
    return json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def decode_entry(blob: bytes) -> dict[str, Any]:
    return json.loads(blob)


@dataclass(slots=True)
class _Kept:
    blob: bytes
    written_at: float


class BoundedResponseStore:
    """Entries in this process, as their JSON encoding (measured exactly, and a reader gets a copy it may
    change). The `*_blob` methods take and return that encoding, for a host that encodes elsewhere (the
    store actor: deployments/response_store.py); `put`/`get`/`delete` are the ResponseStore interface.
    Not thread-safe: one event loop or one actor thread uses it. `clock`: seconds, monotonic."""

    def __init__(self, max_entries: int, max_bytes: int, ttl_s: float, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        # Least recently used first (writes and reads move an entry to the end).
        self._lru: OrderedDict[Key, _Kept] = OrderedDict()
        # Oldest write first: the only ones that can have expired are at its front.
        self._writes: OrderedDict[Key, None] = OrderedDict()
        self.nbytes = 0
        self.evicted = 0
        self.refused = 0
        self.resize(max_entries, max_bytes, ttl_s)

    @classmethod
    def from_limits(cls, limits: Limits, *, clock: Callable[[], float] = time.monotonic) -> "BoundedResponseStore":
        return cls(limits.response_store_entries, limits.response_store_bytes, limits.response_store_ttl_s,
                   clock=clock)

    def resize(self, max_entries: int, max_bytes: int, ttl_s: float) -> None:
        """New bounds; entries past them go at once (least recently used first)."""
        if max_entries < 0 or max_bytes < 0 or ttl_s <= 0:
            raise ValueError(f"bad response store bounds: {max_entries} entries, {max_bytes} bytes, ttl {ttl_s} s")
        self.max_entries, self.max_bytes, self.ttl_s = max_entries, max_bytes, ttl_s
        self._expire(self.clock())
        self._evict()

    def __len__(self) -> int:
        return len(self._lru)

    def stats(self) -> dict[str, Any]:
        return {"entries": len(self._lru), "bytes": self.nbytes, "evicted": self.evicted, "refused": self.refused,
                "max_entries": self.max_entries, "max_bytes": self.max_bytes, "ttl_s": self.ttl_s}

    def put_blob(self, owner: str | None, response_id: str, blob: bytes) -> bool:
        key = (owner, response_id)
        now = self.clock()
        self._expire(now)
        self._drop(key)
        if self.max_entries == 0:
            return False
        if len(blob) > self.max_bytes:
            self.refused += 1
            log.warning("response %s not stored: %d bytes as JSON, more than the store's %d "
                        "(limits.response_store_bytes); it was still returned", response_id, len(blob), self.max_bytes)
            return False
        self._lru[key] = _Kept(blob, now)
        self._writes[key] = None
        self.nbytes += len(blob)
        self._evict()
        return True

    def get_blob(self, owner: str | None, response_id: str) -> bytes | None:
        key = (owner, response_id)
        self._expire(self.clock())
        kept = self._lru.get(key)
        if kept is None:
            return None
        self._lru.move_to_end(key)
        return kept.blob

    def delete_blob(self, owner: str | None, response_id: str) -> bool:
        self._expire(self.clock())
        return self._drop((owner, response_id))

    async def put(self, owner: str | None, response_id: str, entry: dict[str, Any]) -> bool:
        return self.put_blob(owner, response_id, encode_entry(entry))

    async def get(self, owner: str | None, response_id: str) -> dict[str, Any] | None:
        blob = self.get_blob(owner, response_id)
        return None if blob is None else decode_entry(blob)

    async def delete(self, owner: str | None, response_id: str) -> bool:
        return self.delete_blob(owner, response_id)

    def _drop(self, key: Key) -> bool:
        kept = self._lru.pop(key, None)
        if kept is None:
            return False
        del self._writes[key]
        self.nbytes -= len(kept.blob)
        return True

    def _expire(self, now: float) -> None:
        while self._writes:
            key = next(iter(self._writes))
            if now - self._lru[key].written_at < self.ttl_s:
                return
            self._drop(key)

    def _evict(self) -> None:
        while self._lru and (len(self._lru) > self.max_entries or self.nbytes > self.max_bytes):
            self._drop(next(iter(self._lru)))
            self.evicted += 1


class MemoryResponseStore(BoundedResponseStore):
    """A store with the default limits in this process (unit tests)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        limits = Limits()
        super().__init__(limits.response_store_entries, limits.response_store_bytes, limits.response_store_ttl_s,
                         clock=clock)
