"""The persistent tiers of one model's KV, as the engine sees them: the node's disk, then the cluster's store.

`longest(tokens, scope)` finds the stored prefix of a prompt that is longest (token for token, in the prompt's own
scope only), from the nearest tier that has it; `fetch` reads it (checked: entry.py) and, from the store, keeps a
copy on the disk for next time; `save` queues a state to be written to every tier. Lookups read indexes held in
memory (each tier's records, by scope, as token tables); reads run on the caller's thread (the preparation pool:
the request that benefits waits for them); writes, scans and evictions run on this object's own threads, so
neither the decode thread nor a request ever waits for a write.

A tier that fails (a full or read-only disk, an unreachable store) is set aside for `RETRY_S` and retried; it is
logged once per episode and counted; the other tiers and the replica's memory keep serving. The model key (key.py:
its GGUF's checksum, read once per node) is found in the background at start: until then nothing is looked up or
saved."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .entry import EntryError, IndexRecord, index_record
from .key import StoreKey
from .token_table import TokenTable

log = logging.getLogger("llamaray.kvstore")

RETRY_S = 30.0          # a failing tier is set aside this long
REFRESH_S = 10.0        # the cluster store's index is read again this often (other replicas write to it)
DISK_RESCAN_S = 60.0    # and the disk's (other replicas on this node write to it)
# States waiting to be written; past it a save is dropped (and counted). It absorbs a burst of saves (a few
# states of long prompts) while the writer catches up; every loaded model may hold this much, so it stays small.
MAX_QUEUED_BYTES = 256 << 20


@dataclass(frozen=True)
class Match:
    tier: str
    record: IndexRecord
    shared: int  # tokens of the prompt the entry holds


@dataclass
class TierCounters:
    hits: int = 0
    misses: int = 0           # lookups that found nothing in this tier
    read_bytes: int = 0
    read_s: float = 0.0
    saves: int = 0
    save_bytes: int = 0
    save_s: float = 0.0
    errors: int = 0
    refused: int = 0          # entries found unusable and removed
    evicted: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in self.__dict__.items()}


@dataclass
class _Tier:
    backend: Any  # DiskTier or StoreTier
    counters: TierCounters = field(default_factory=TierCounters)
    tables: dict[str, TokenTable] = field(default_factory=dict)   # scope -> its records' tokens
    records: dict[int, IndexRecord] = field(default_factory=dict)  # table key -> record
    by_name: dict[str, int] = field(default_factory=dict)          # entry name -> table key
    stored_bytes: int = 0
    down_until: float = 0.0
    read_rate: float = 0.0  # bytes/s, a moving average of this tier's reads

    @property
    def name(self) -> str:
        return self.backend.name


class TieredStore:
    """`tiers`: the backends, nearest first. `key`: called once, in the background, for the model's StoreKey (None:
    the tiers stay off for this model). `min_tokens`: shorter states are not worth a file."""

    def __init__(self, tiers: list[Any], key: Callable[[], StoreKey | None], min_tokens: int = 256,
                 max_queued_bytes: int = MAX_QUEUED_BYTES) -> None:
        self._tiers = [_Tier(t) for t in tiers]
        self._key_fn = key
        self.key: str | None = None
        self.min_tokens = min_tokens
        self.max_queued_bytes = max_queued_bytes
        self._lock = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._queued_bytes = 0
        self.dropped = 0
        self._next_id = 0
        self._closing = threading.Event()
        self._ready = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- life ---------------------------------------------------------------------------------------------------
    def start(self, wait_s: float = 0.0) -> "TieredStore":
        """Start the writer thread, which finds the key and reads the tiers' indexes first; wait up to `wait_s` for
        that (a model whose checksum this node has read before is ready at once: a replaced replica looks its
        predecessor's states up from its first request on; a new large model's first read goes on in the
        background)."""
        thread = threading.Thread(target=self._run_writer, name="kvstore-writer", daemon=True)
        self._threads.append(thread)
        thread.start()
        if wait_s > 0:
            self._ready.wait(wait_s)
        return self

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Whether the tiers are on (their key found and indexes read) within `timeout` (tests, benches)."""
        return self._ready.wait(timeout) and self.key is not None

    def close(self) -> None:
        self._closing.set()
        self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout=10)

    # -- lookups (any thread) -----------------------------------------------------------------------------------
    def longest(self, tokens: np.ndarray, scope: str) -> Match | None:
        """The entry of `scope` sharing the longest prefix with `tokens`, from the nearest tier with that length; None
        when no tier has one. (Whether reading it pays is the caller's to decide: an entry of `min_tokens` or more
        may share less than that with a prompt and still save a prefill.)"""
        if self.key is None:
            return None
        best: Match | None = None
        now = time.monotonic()
        with self._lock:
            for tier in self._tiers:
                table = tier.tables.get(scope)
                if table is None or tier.down_until > now or not len(table):
                    continue
                shared = table.shared(tokens)
                row = int(shared.argmax())
                if shared[row] > 0 and (best is None or shared[row] > best.shared):
                    best = Match(tier.name, tier.records[table.keys[row]], int(shared[row]))
        return best

    def fetch(self, match: Match) -> bytes | None:
        """`match`'s payload, checked; None if its tier failed or the entry proved unusable (it is removed then).
        A payload read from the store is kept on the nearer tiers too."""
        tier = self._tier(match.tier)
        started = time.monotonic()
        try:
            payload = tier.backend.read(match.record)
        except EntryError as exc:
            log.warning("kv %s: entry %s refused and removed: %s", tier.name, match.record.name[:12], exc)
            tier.counters.refused += 1
            self._forget(tier, match.record.name)
            return None
        except FileNotFoundError:
            self._forget(tier, match.record.name)  # evicted or removed by another replica meanwhile
            return None
        except Exception as exc:  # noqa: BLE001 - a failing tier is set aside; the request prefills
            self._failed(tier, "read", exc)
            return None
        elapsed = max(time.monotonic() - started, 1e-6)
        c = tier.counters
        c.hits += 1
        c.read_bytes += len(payload)
        c.read_s += elapsed
        rate = len(payload) / elapsed
        tier.read_rate = rate if tier.read_rate == 0 else 0.7 * tier.read_rate + 0.3 * rate
        nearer = self._tiers[:self._tiers.index(tier)]
        if nearer and self._reserve(len(payload)):
            self._queue.put(("copy", match.record, payload, nearer))
        return payload

    def missed(self, tier_names: list[str] | None = None) -> None:
        """A lookup that used no tier (counted in each tier that is up)."""
        for tier in self._tiers:
            if tier_names is None or tier.name in tier_names:
                tier.counters.misses += 1

    def read_rate(self, tier_name: str) -> float:
        """Bytes per second this replica reads from a tier (0: not measured yet)."""
        return self._tier(tier_name).read_rate

    # -- saves (any thread; written on the writer thread) ------------------------------------------------------------
    def wants(self, tokens: np.ndarray, scope: str) -> bool:
        """Whether a state of `tokens` in `scope` would be kept: the tiers are on, it is long enough, and the nearest
        tier holds no entry covering all but fewer than `min_tokens` of it (so the engine does not copy a state out of
        its context for nothing). An entry is a whole sequence's state, not chunks: a conversation's turn, or a new
        question after a shared preamble, would otherwise store the preamble's megabytes again for a few tokens more,
        and a pool writes each slot so at every eviction. A restore of the covering entry leaves fewer than
        `min_tokens` to prefill, the length the tiers already judge not worth keeping."""
        if self.key is None or len(tokens) < self.min_tokens:
            return False
        with self._lock:
            table = self._tiers[0].tables.get(scope)
            return table is None or not len(table) or \
                int(table.shared(tokens).max()) <= len(tokens) - self.min_tokens

    def save(self, tokens: np.ndarray, state: Any, size: int, scope: str) -> bool:
        """Queue one sequence's state (`state`: a bytes-like buffer of at least `size` bytes, not changed afterwards)
        to be written to every tier; False when it is not taken (too short, tiers off, the queue full)."""
        if self.key is None or len(tokens) < self.min_tokens or size <= 0 or not self._reserve(size):
            return False
        self._queue.put(("save", np.array(tokens, dtype=np.int32), state, size, scope))
        return True

    def _reserve(self, size: int) -> bool:
        """Room in the write queue for `size` bytes (released once written); False: the save is dropped."""
        with self._lock:
            if self._queued_bytes + size > self.max_queued_bytes:
                self.dropped += 1
                return False
            self._queued_bytes += size
            return True

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued write is done (tests, benches)."""
        done = threading.Event()
        self._queue.put(("flush", done))
        return done.wait(timeout)

    # -- stats ----------------------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        with self._lock:
            tiers = {t.name: {"entries": len(t.records), "bytes": t.stored_bytes, "up": t.down_until <= time.monotonic(),
                              "read_mb_s": round(t.read_rate / 1e6, 1), **t.counters.as_dict()} for t in self._tiers}
            return {"ready": self.key is not None, "queued_bytes": self._queued_bytes, "dropped": self.dropped,
                    "tiers": tiers}

    # -- the writer thread ------------------------------------------------------------------------------------------
    def _run_writer(self) -> None:
        try:
            key = self._key_fn()
        except Exception as exc:  # noqa: BLE001 - without a key the tiers stay off; the model serves
            log.warning("kv tiers off for this model: its identity could not be read (%r)", exc)
            key = None
        if key is not None:
            self.key = key.digest()
            for tier in self._tiers:
                self._scan(tier)
            log.info("kv tiers on (%s): %s", self.key[:12], ", ".join(
                f"{t.name} {len(t.records)} entries, {t.stored_bytes / 1e6:.0f} MB" for t in self._tiers))
        self._ready.set()
        if key is None:
            return
        scanned = {t.name: time.monotonic() for t in self._tiers}
        while not self._closing.is_set():
            try:
                item = self._queue.get(timeout=1.0)
            except queue.Empty:
                item = ()
            if item is None:
                return
            if item and item[0] == "save":
                self._write_all(*item[1:])
            elif item and item[0] == "copy":
                _, record, payload, tiers = item
                try:
                    for tier in tiers:
                        self._write(tier, record, payload)
                finally:
                    with self._lock:
                        self._queued_bytes -= record.size
            elif item and item[0] == "flush":
                item[1].set()
            now = time.monotonic()
            for tier in self._tiers:
                period = DISK_RESCAN_S if tier.name == "disk" else REFRESH_S
                if now - scanned[tier.name] >= period:
                    scanned[tier.name] = now
                    self._scan(tier)

    def _write_all(self, tokens: np.ndarray, state: Any, size: int, scope: str) -> None:
        try:
            payload = memoryview(state).cast("B")[:size]
            record = index_record(self.key, scope, tokens, payload)
            for tier in self._tiers:
                self._write(tier, record, payload)
        finally:
            with self._lock:
                self._queued_bytes -= size

    def _write(self, tier: _Tier, record: IndexRecord, payload: Any) -> None:
        if tier.down_until > time.monotonic():
            return
        with self._lock:
            if record.name in tier.by_name:
                return  # already there (this replica's own entry, or another's with the same tokens)
        started = time.monotonic()
        try:
            tier.backend.write(record, payload)
            gone = tier.backend.evict(self.key) if hasattr(tier.backend, "evict") else []
        except Exception as exc:  # noqa: BLE001 - a full or read-only disk, an unreachable store
            self._failed(tier, "write", exc)
            return
        c = tier.counters
        c.saves += 1
        c.save_bytes += record.size
        c.save_s += time.monotonic() - started
        c.evicted += len(gone)
        self._add(tier, record)
        for name in gone:
            self._forget(tier, name)

    def _scan(self, tier: _Tier) -> None:
        if tier.down_until > time.monotonic():
            return
        with self._lock:
            known = set(tier.by_name)
        try:
            found = list(tier.backend.scan(self.key, known))
        except Exception as exc:  # noqa: BLE001
            self._failed(tier, "scan", exc)
            return
        listed = {name for name, _ in found}
        for name in known - listed:  # evicted or removed by another replica
            self._forget(tier, name)
        with self._lock:
            for _, record in found:
                if record is not None:
                    self._add_locked(tier, record)

    # -- indexes ---------------------------------------------------------------------------------------------------
    def _add(self, tier: _Tier, record: IndexRecord) -> None:
        with self._lock:
            self._add_locked(tier, record)

    def _add_locked(self, tier: _Tier, record: IndexRecord) -> None:
        if record.name in tier.by_name:
            return
        key, self._next_id = self._next_id, self._next_id + 1
        tier.records[key] = record
        tier.by_name[record.name] = key
        tier.tables.setdefault(record.scope, TokenTable()).add(key, record.tokens)
        tier.stored_bytes += record.size

    def _forget(self, tier: _Tier, name: str) -> None:
        with self._lock:
            key = tier.by_name.pop(name, None)
            if key is None:
                return
            record = tier.records.pop(key)
            table = tier.tables[record.scope]
            table.remove(key)
            if not len(table):
                del tier.tables[record.scope]
            tier.stored_bytes -= record.size

    def _tier(self, name: str) -> _Tier:
        return next(t for t in self._tiers if t.name == name)

    def _failed(self, tier: _Tier, what: str, exc: BaseException) -> None:
        tier.counters.errors += 1
        first = tier.down_until <= time.monotonic()
        tier.down_until = time.monotonic() + RETRY_S
        if first:
            log.warning("kv %s tier set aside for %.0f s: %s failed: %r (requests go on with the other tiers)",
                        tier.name, RETRY_S, what, exc)
