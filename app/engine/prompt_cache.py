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

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Shorter token runs are not worth an entry: every chat prompt starts with its template's header, which
# the slots themselves keep.
MIN_TOKENS = 32


@dataclass(eq=False)
class Entry:
    tokens: np.ndarray  # what the saved KV holds, in order
    state: Any          # llama.cpp's serialized sequence (a bytes-like buffer)
    size: int           # bytes held
    scope: str          # the cache scope of the prompts that computed it


PAD = -1  # never a token id: a row's padding ends its prefix


class TokenTable:
    """One scope's entries' tokens as the rows of one padded matrix, so that a prompt's shared prefix with every
    entry is one numpy comparison. The engine looks up the cache at each admission, on the decode thread that
    every running stream waits on; comparing entry by entry in Python cost ~4 us an entry a lookup, and three
    lookups an admission took ~3 ms once a small model's cache held a few hundred prompts (docs/history/benchmarks-2026.md).
    Adding and removing a row copy one row (a removed row takes the last row's place)."""

    def __init__(self) -> None:
        self.matrix = np.full((8, 256), PAD, dtype=np.int32)
        self.lengths = np.zeros(8, dtype=np.int64)
        self.keys: list[int] = []        # row -> entry key
        self.rows: dict[int, int] = {}   # entry key -> row

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, key: int, tokens: np.ndarray) -> None:
        n, width = len(self.keys), self.matrix.shape[1]
        if n == self.matrix.shape[0] or len(tokens) > width:
            grown = np.full((max(self.matrix.shape[0], 2 * n), max(width, 1 << int(len(tokens) - 1).bit_length())),
                            PAD, dtype=np.int32)
            grown[:n, :width] = self.matrix[:n]
            lengths = np.zeros(grown.shape[0], dtype=np.int64)
            lengths[:n] = self.lengths[:n]
            self.matrix, self.lengths = grown, lengths
        self.matrix[n, :len(tokens)] = tokens
        self.lengths[n] = len(tokens)
        self.keys.append(key)
        self.rows[key] = n

    def remove(self, key: int) -> None:
        row, last = self.rows.pop(key), len(self.keys) - 1
        if row != last:
            self.matrix[row] = self.matrix[last]
            self.lengths[row] = self.lengths[last]
            self.keys[row] = self.keys[last]
            self.rows[self.keys[row]] = row
        self.matrix[last] = PAD
        self.lengths[last] = 0
        self.keys.pop()

    def shared(self, tokens: np.ndarray) -> np.ndarray:
        """Each row's shared prefix with `tokens` (row order)."""
        n_rows, n = len(self.keys), min(self.matrix.shape[1], len(tokens))
        if n == 0:
            return np.zeros(n_rows, dtype=np.int64)
        differ = self.matrix[:n_rows, :n] != tokens[:n]
        return np.where(differ.any(axis=1), differ.argmax(axis=1), n)


class PromptCache:
    def __init__(self, max_bytes: int, min_tokens: int = MIN_TOKENS) -> None:
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # id -> entry, least recently used first
        self._tables: dict[str, TokenTable] = {}                # scope -> its entries' tokens
        self._next_id = 0
        self.bytes = 0
        self.hits = 0

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
        table = self._tables.get(scope)
        arr = np.asarray(tokens, dtype=np.int32)
        return table is None or not bool((table.shared(arr) == len(arr)).any())

    def put(self, tokens: Sequence[int], state: Any, size: int, scope: str) -> None:
        """Store the KV of `tokens`, computed in `scope`; that scope's entries it extends (their tokens a
        prefix of these) are dropped."""
        if not self.enabled or size > self.max_bytes:
            return
        arr = np.asarray(tokens, dtype=np.int32)
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
        table = self._tables.get(scope)
        if table is None:
            return None, 0
        shared = table.shared(np.asarray(prompt, dtype=np.int32))
        row = int(shared.argmax())
        if shared[row] == 0:
            return None, 0
        key = table.keys[row]
        self._entries.move_to_end(key)
        return self._entries[key], int(shared[row])

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self.bytes -= entry.size
        table = self._tables[entry.scope]
        table.remove(key)
        if not len(table):
            del self._tables[entry.scope]

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._entries), "bytes": self.bytes, "hits": self.hits}
