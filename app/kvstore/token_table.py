"""Many stored token sequences, and how long a prefix each shares with a prompt, in one numpy comparison."""

from __future__ import annotations

import numpy as np

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
        # Capped at each row's length: padding must never count as a match (an image's pseudo ids are negative).
        return np.minimum(np.where(differ.any(axis=1), differ.argmax(axis=1), n), self.lengths[:n_rows])
