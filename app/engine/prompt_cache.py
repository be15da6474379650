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


def shared_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two token arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


@dataclass(eq=False)
class Entry:
    tokens: np.ndarray  # what the saved KV holds, in order
    state: Any          # llama.cpp's serialized sequence (a bytes-like buffer)
    size: int           # bytes held
    scope: str          # the cache scope of the prompts that computed it


class PromptCache:
    def __init__(self, max_bytes: int, min_tokens: int = MIN_TOKENS) -> None:
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # id -> entry, least recently used first
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
        arr = np.asarray(tokens, dtype=np.int32)
        return not any(e.scope == scope and len(e.tokens) >= len(arr) and shared_prefix(e.tokens, arr) == len(arr)
                       for e in self._entries.values())

    def put(self, tokens: Sequence[int], state: Any, size: int, scope: str) -> None:
        """Store the KV of `tokens`, computed in `scope`; that scope's entries it extends (their tokens a
        prefix of these) are dropped."""
        if not self.enabled or size > self.max_bytes:
            return
        arr = np.asarray(tokens, dtype=np.int32)
        for key, e in list(self._entries.items()):
            if e.scope == scope and len(e.tokens) <= len(arr) and shared_prefix(e.tokens, arr) == len(e.tokens):
                self._drop(key)
        while self._entries and self.bytes + size > self.max_bytes:
            self._drop(next(iter(self._entries)))
        self._entries[self._next_id] = Entry(arr, state, size, scope)
        self._next_id += 1
        self.bytes += size

    def best(self, prompt: Sequence[int], scope: str) -> tuple[Entry | None, int]:
        """The entry of `scope` sharing the longest prefix with `prompt`, and that length (0: none)."""
        if not self._entries:
            return None, 0
        arr = np.asarray(prompt, dtype=np.int32)
        best_key, best_len = None, 0
        for key, e in self._entries.items():
            if e.scope != scope:
                continue
            n = shared_prefix(e.tokens, arr)
            if n > best_len:
                best_key, best_len = key, n
        if best_key is None:
            return None, 0
        self._entries.move_to_end(best_key)
        return self._entries[best_key], best_len

    def _drop(self, key: int) -> None:
        self.bytes -= self._entries.pop(key).size

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._entries), "bytes": self.bytes, "hits": self.hits}
