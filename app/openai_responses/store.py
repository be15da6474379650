"""Where stored responses live (`store: true`, the Responses API's default): kept so that
`previous_response_id` continues a conversation and `GET /v1/responses/{id}` returns it.

An entry is a JSON-able dict (the response object and what a follow-up turn needs); `owner` is the
caller's key id (app/generation/caller.py), and an entry is only ever returned to its owner.

`BoundedResponseStore` keeps entries in memory within bounds (app/config/app_args.py, `Limits`): how many,
how many bytes (an entry's compact JSON encoding), and how long (`ttl_s` from its last write); and, for each
owner, how many and how many bytes (`response_store_key_entries`/`_bytes`), so that one key cannot flush the
others' conversations out.

Who loses an entry, least recently written or read first:
- an owner past its own budget loses its own entries, and only those;
- when the whole store is past a bound, the owner holding the most of it (bytes, or entries, whichever bound
  is crossed) loses one. An owner holding at most its fair share (the bound divided by the owners holding
  entries) is therefore never evicted by another's writes: the largest owner holds more than that.
Owner None (a server without API keys: every caller is the same one) has no budget of its own, only the
store's.

An entry larger than the owner's byte budget (or the store's) is not kept: its response was generated and is
still returned to the client (a user who sent a big request wants its answer more than a later continuation
of it), so `store` is honoured on a best-effort basis, as it is for any entry evicted later; `put` returns
False and the store logs one line.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..api import strict_json
from ..config.app_args import Limits

log = logging.getLogger("llamaray.responses")

Key = tuple[str | None, str]


class ResponseStore(Protocol):
    async def put(self, owner: str | None, response_id: str, entry: dict[str, Any]) -> bool:
        """Keep `entry` (replacing the owner's entry of that id). False: not kept (larger than the owner's or
        the store's byte bound, or storing is off); nothing of that id is kept then."""

    async def get(self, owner: str | None, response_id: str) -> dict[str, Any] | None:
        """The entry, or None: unknown, expired, or another owner's (indistinguishable on purpose)."""

    async def delete(self, owner: str | None, response_id: str) -> bool:
        """True: the owner's entry was there and is gone; False as for `get`'s None."""


def encode_entry(entry: dict[str, Any]) -> bytes:
    """An entry as it is kept and measured: compact strict JSON, UTF-8 (a non-finite float is a ValueError,
    never an entry that could not be read back as JSON)."""
    return strict_json.dumps_bytes(entry)


def decode_entry(blob: bytes) -> dict[str, Any]:
    return strict_json.loads(blob)


@dataclass(slots=True)
class _Kept:
    blob: bytes
    written_at: float


@dataclass(slots=True)
class _Shelf:
    """One owner's entries: ids least recently used first, and their bytes."""
    lru: OrderedDict[str, None] = field(default_factory=OrderedDict)
    nbytes: int = 0


class BoundedResponseStore:
    """Entries in this process, as their JSON encoding (measured exactly, and a reader gets a copy it may
    change). The `*_blob` methods take and return that encoding, for a host that encodes elsewhere (the
    store actor: deployments/response_store.py); `put`/`get`/`delete` are the ResponseStore interface.
    Not thread-safe: one event loop or one actor thread uses it. `clock`: seconds, monotonic.
    `key_entries`/`key_bytes`: each owner's budget (None: the store's bound)."""

    def __init__(self, max_entries: int, max_bytes: int, ttl_s: float, *, key_entries: int | None = None,
                 key_bytes: int | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._kept: dict[Key, _Kept] = {}
        self._shelves: dict[str | None, _Shelf] = {}
        # Oldest write first: the only ones that can have expired are at its front.
        self._writes: OrderedDict[Key, None] = OrderedDict()
        self.nbytes = 0
        self.evicted = 0
        self.refused = 0
        self.resize(max_entries, max_bytes, ttl_s, key_entries=key_entries, key_bytes=key_bytes)

    @classmethod
    def from_limits(cls, limits: Limits, *, clock: Callable[[], float] = time.monotonic) -> "BoundedResponseStore":
        return cls(limits.response_store_entries, limits.response_store_bytes, limits.response_store_ttl_s,
                   key_entries=limits.response_store_key_entries, key_bytes=limits.response_store_key_bytes,
                   clock=clock)

    def resize(self, max_entries: int, max_bytes: int, ttl_s: float, *, key_entries: int | None = None,
               key_bytes: int | None = None) -> None:
        """New bounds; entries past them go at once (least recently used first)."""
        key_entries = max_entries if key_entries is None else key_entries
        key_bytes = max_bytes if key_bytes is None else key_bytes
        if min(max_entries, max_bytes, key_entries, key_bytes) < 0 or ttl_s <= 0:
            raise ValueError(f"bad response store bounds: {max_entries} entries ({key_entries} a key), {max_bytes} "
                             f"bytes ({key_bytes} a key), ttl {ttl_s} s")
        self.max_entries, self.max_bytes, self.ttl_s = max_entries, max_bytes, ttl_s
        self.key_entries, self.key_bytes = key_entries, key_bytes
        self._expire(self.clock())
        for owner in list(self._shelves):
            self._evict_own(owner)
        self._evict_largest()

    def __len__(self) -> int:
        return len(self._kept)

    def stats(self) -> dict[str, Any]:
        return {"entries": len(self._kept), "bytes": self.nbytes, "owners": len(self._shelves),
                "evicted": self.evicted, "refused": self.refused, "max_entries": self.max_entries,
                "max_bytes": self.max_bytes, "key_entries": self.key_entries, "key_bytes": self.key_bytes,
                "ttl_s": self.ttl_s}

    def owner_stats(self, owner: str | None) -> dict[str, int]:
        shelf = self._shelves.get(owner)
        return {"entries": len(shelf.lru), "bytes": shelf.nbytes} if shelf else {"entries": 0, "bytes": 0}

    def put_blob(self, owner: str | None, response_id: str, blob: bytes) -> bool:
        key = (owner, response_id)
        now = self.clock()
        self._expire(now)
        self._drop(key)
        if self.max_entries == 0 or (owner is not None and self.key_entries == 0):
            return False
        bound, name = self._byte_bound(owner)
        if len(blob) > bound:
            self.refused += 1
            log.warning("response %s not stored: %d bytes as JSON, more than the %d of %s; it was still "
                        "returned", response_id, len(blob), bound, name)
            return False
        self._kept[key] = _Kept(blob, now)
        self._writes[key] = None
        shelf = self._shelves.setdefault(owner, _Shelf())
        shelf.lru[response_id] = None
        shelf.nbytes += len(blob)
        self.nbytes += len(blob)
        self._evict_own(owner)
        self._evict_largest(owner)
        return key in self._kept

    def get_blob(self, owner: str | None, response_id: str) -> bytes | None:
        key = (owner, response_id)
        self._expire(self.clock())
        kept = self._kept.get(key)
        if kept is None:
            return None
        self._shelves[owner].lru.move_to_end(response_id)
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

    def _byte_bound(self, owner: str | None) -> tuple[int, str]:
        if owner is not None and self.key_bytes < self.max_bytes:
            return self.key_bytes, "a key's budget (limits.response_store_key_bytes)"
        return self.max_bytes, "the store (limits.response_store_bytes)"

    def _drop(self, key: Key) -> bool:
        kept = self._kept.pop(key, None)
        if kept is None:
            return False
        del self._writes[key]
        owner, response_id = key
        shelf = self._shelves[owner]
        del shelf.lru[response_id]
        shelf.nbytes -= len(kept.blob)
        if not shelf.lru:
            del self._shelves[owner]
        self.nbytes -= len(kept.blob)
        return True

    def _evict_one(self, owner: str | None) -> None:
        self._drop((owner, next(iter(self._shelves[owner].lru))))
        self.evicted += 1

    def _expire(self, now: float) -> None:
        while self._writes:
            key = next(iter(self._writes))
            if now - self._kept[key].written_at < self.ttl_s:
                return
            self._drop(key)

    def _evict_own(self, owner: str | None) -> None:
        """An owner past its budget loses its own least recently used entries (owner None has none)."""
        if owner is None:
            return
        while (shelf := self._shelves.get(owner)) and (len(shelf.lru) > self.key_entries
                                                       or shelf.nbytes > self.key_bytes):
            self._evict_one(owner)

    def _evict_largest(self, writer: str | None = None) -> None:
        """While the store is past a bound, the owner holding the most of what is crossed loses its least
        recently used entry (on a tie, the one writing). A scan of the owners (API keys holding entries:
        few) per eviction."""
        while self._kept:
            if self.nbytes > self.max_bytes:
                owner = max(self._shelves, key=lambda o: (self._shelves[o].nbytes, o == writer))
            elif len(self._kept) > self.max_entries:
                owner = max(self._shelves, key=lambda o: (len(self._shelves[o].lru), o == writer))
            else:
                return
            self._evict_one(owner)


class MemoryResponseStore(BoundedResponseStore):
    """A store with the default limits in this process (unit tests)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        limits = Limits()
        super().__init__(limits.response_store_entries, limits.response_store_bytes, limits.response_store_ttl_s,
                         key_entries=limits.response_store_key_entries, key_bytes=limits.response_store_key_bytes,
                         clock=clock)
