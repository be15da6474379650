"""Slots' KV kept in host memory after their slot is reused, so a prompt that comes back skips its
prefill (what llama-server calls its prompt cache, `--cache-ram`).

A replica has only `n_seq_max` slots; a prompt that returns after its slot went to another one (the
same question asked again, a conversation's next turn after a pause, one of many system prompts)
would recompute everything past the chat template's first lines. Before a slot's KV is overwritten,
the engine stores it here with the tokens it holds; a new prompt that shares a longer prefix with a
stored entry than with any slot gets that entry's KV restored into its slot, then cut to the shared
prefix.

Plain data: the engine (the only user, on its thread) serializes and restores the KV through
llama.cpp's per-sequence state API (app/engine/llama.py). Bounded by bytes, least recently used out.

Every entry belongs to a cache scope (GenerationRequest.cache_scope): a prompt only ever finds, covers or
replaces entries of its own scope, so one user's cached prefix never shortens another's prefill (and
`cached_tokens` never tells one user what another sent).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..kvstore.token_table import TokenTable

# Shorter token runs are not worth an entry: every chat prompt starts with its template's header, which
# the slots themselves keep.
MIN_TOKENS = 32


@dataclass(eq=False)
class Entry:
    tokens: np.ndarray  # what the saved KV holds, in order
    state: Any          # llama.cpp's serialized sequence (a bytes-like buffer)
    size: int           # bytes held
    scope: str          # the cache scope of the prompts that computed it


class PromptCache:
    """Used by the decode thread; `longest` may be asked from any thread (a request's preparation asks whether the
    persistent tiers have a longer prefix than memory), so the tables are read and changed under a lock."""

    def __init__(self, max_bytes: int, min_tokens: int = MIN_TOKENS) -> None:
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # id -> entry, least recently used first
        self._tables: dict[str, TokenTable] = {}                # scope -> its entries' tokens
        self._next_id = 0
        self.bytes = 0
        self.hits = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def worth_keeping(self, tokens: Sequence[int], scope: str) -> bool:
        """Whether KV of `tokens` (computed in `scope`) about to be overwritten should be saved first:
        long enough, and not already covered by an entry of that scope holding these tokens or more."""
        if not self.enabled or len(tokens) < self.min_tokens:
            return False
        arr = np.asarray(tokens, dtype=np.int32)
        with self._lock:
            table = self._tables.get(scope)
            return table is None or not bool((table.shared(arr) == len(arr)).any())

    def put(self, tokens: Sequence[int], state: Any, size: int, scope: str) -> None:
        """Store the KV of `tokens`, computed in `scope`; that scope's entries it extends (their tokens a
        prefix of these) are dropped."""
        if not self.enabled or size > self.max_bytes:
            return
        arr = np.asarray(tokens, dtype=np.int32)
        with self._lock:
            table = self._tables.setdefault(scope, TokenTable())
            extended = table.shared(arr) == table.lengths[:len(table)]
            for key in [table.keys[row] for row in np.flatnonzero(extended)]:
                self._drop(key)
            while self._entries and self.bytes + size > self.max_bytes:
                self._drop(next(iter(self._entries)))
            key = self._next_id
            self._entries[key] = Entry(arr, state, size, scope)
            self._tables.setdefault(scope, table).add(key, arr)
            self._next_id += 1
            self.bytes += size

    def best(self, prompt: Sequence[int], scope: str) -> tuple[Entry | None, int]:
        """The entry of `scope` sharing the longest prefix with `prompt`, and that length (0: none)."""
        arr = np.asarray(prompt, dtype=np.int32)
        with self._lock:
            table = self._tables.get(scope)
            if table is None:
                return None, 0
            shared = table.shared(arr)
            row = int(shared.argmax())
            if shared[row] == 0:
                return None, 0
            key = table.keys[row]
            self._entries.move_to_end(key)
            return self._entries[key], int(shared[row])

    def longest(self, prompt: Sequence[int], scope: str) -> int:
        """The longest prefix of `prompt` an entry of `scope` holds (0: none), without touching its recency."""
        arr = np.asarray(prompt, dtype=np.int32)
        with self._lock:
            table = self._tables.get(scope)
            return int(table.shared(arr).max()) if table is not None and len(table) else 0

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self.bytes -= entry.size
        table = self._tables[entry.scope]
        table.remove(key)
        if not len(table):
            del self._tables[entry.scope]

    def clear(self) -> None:
        """Every entry dropped (the engine is closing): its states freed now, not whenever the collector finds
        the closed engine."""
        with self._lock:
            self._entries.clear()
            self._tables.clear()
            self.bytes = 0

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._entries), "bytes": self.bytes, "hits": self.hits}
