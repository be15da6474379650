"""What a decode step costs by its rows, learnt from the engine's own steps while it serves.

Batch work beside interactive requests (app/engine/batch_rows.py) is given rows by what they add to a step's time:
on a GPU a step of 16 rows takes about as long as a step of 4, so batch lines ride along for free; on a CPU every
row costs most of a token's time (a 2-core machine: 7 ms at 1 row, 15 at 4, 51 at 16), so the same rows would slow
each interactive token threefold. No fixed rule serves both, so the engine measures: each step's time goes to the
bucket of its row count (powers of two), kept as a moving average of rows and seconds, and a size between buckets
is read off the line between their averages. Speculation's StepCost is timed once with synthetic rows; this one
follows the real steps (prompt chunks, grammars and sampling included) and needs no start-up time."""

from __future__ import annotations

import math

# Weight of a new step in its bucket's averages: a few dozen steps make the estimate, and a machine that
# slows down (another process, thermal limits) is followed within seconds.
SMOOTHING = 0.1


class StepTimes:
    def __init__(self, smoothing: float = SMOOTHING) -> None:
        self.smoothing = smoothing
        self._buckets: dict[int, list[float]] = {}  # log2 bucket -> [mean rows, mean seconds]

    def observe(self, rows: int, seconds: float) -> None:
        if rows <= 0 or not math.isfinite(seconds) or seconds <= 0:
            return
        bucket = self._buckets.get(key := rows.bit_length())
        if bucket is None:
            self._buckets[key] = [float(rows), seconds]
            return
        a = self.smoothing
        bucket[0] += a * (rows - bucket[0])
        bucket[1] += a * (seconds - bucket[1])

    def known(self, rows: int) -> bool:
        """Whether steps of about `rows` rows were measured (their bucket has steps)."""
        return rows > 0 and rows.bit_length() in self._buckets

    def seconds(self, rows: int) -> float | None:
        """A step of `rows` rows' time: interpolated between the measured buckets around it; beyond the largest,
        the last slope (or proportional to rows, with one bucket); None before any step."""
        points = sorted(self._buckets.values())
        if not points:
            return None
        if len(points) == 1:
            r, s = points[0]
            return s * rows / r
        i = 1
        while i < len(points) - 1 and rows > points[i][0]:
            i += 1
        (r0, s0), (r1, s1) = points[i - 1], points[i]
        slope = max(0.0, (s1 - s0) / (r1 - r0)) if r1 > r0 else 0.0
        return max(s0 + slope * (rows - r0), 1e-9)

    def rows_within(self, limit_s: float, most: int) -> int:
        """The most rows (up to `most`) a step may have and take at most `limit_s`; `most` where that size was never
        measured (that step measures it)."""
        if most <= 0:
            return 0
        if not self.known(most):
            return most
        lo, hi = 0, most  # the largest n with seconds(n) <= limit_s (seconds grows with rows)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if (self.seconds(mid) or 0.0) <= limit_s:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def extra_rows(self, base: int, slowdown: float, most: int) -> int:
        """How many rows (up to `most`) a step of `base` rows may take on beside them, keeping it within
        (1 + slowdown) times its time alone. A size never measured is tried (that step measures it): the budget
        follows the hardware rather than a guess."""
        if most <= 0:
            return 0
        base = max(base, 1)
        alone = self.seconds(base)
        if alone is None:
            return most
        return max(0, self.rows_within(alone * (1 + slowdown), base + most) - base)

    def as_dict(self) -> dict[int, float]:
        """Mean seconds by mean rows, for stats."""
        return {round(r): s for r, s in sorted(self._buckets.values())}
