"""Workload shapes (ramp schedules) and the two drivers that follow them.

Ramp syntax (`--ramp`): comma-separated segments, run one after the other.

    LEVEL:DURATION          hold LEVEL for DURATION
    FROM-TO:DURATION        change linearly from FROM to TO over DURATION

LEVEL is the concurrency (closed loop, whole numbers) or the request rate in requests/s (open
loop, decimals allowed); 0 is a pause. DURATION is a number with a unit, `ms`, `s`, `m` or `h`,
and units can be chained (`1m30s`); a bare number means seconds.

    "1:30s,1-32:2m,32:1m,32-1:1m"   1 for 30 s, up to 32 over 2 min, hold 1 min, down over 1 min
    "0.5-8:5m"                      (open loop) rate from 0.5 to 8 requests/s over 5 min

Closed loop: worker k (0-based) runs while the current concurrency is above k; ramping up starts
workers, ramping down lets the surplus workers finish their request and stop (none is cut).
Open loop: arrivals follow the rate (Poisson or evenly spaced) whatever the server does; an
arrival that finds `max_in_flight` requests still running is dropped and counted.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass

MODES = ("closed", "open")
ARRIVALS = ("poisson", "uniform")
TICK_S = 0.05   # how often the closed loop re-reads the schedule; far below any useful ramp step


class RampError(ValueError):
    """An invalid --ramp spec; the message names the segment and says what is wrong."""


@dataclass(frozen=True)
class Segment:
    start_level: float
    end_level: float
    duration_s: float

    @property
    def is_hold(self) -> bool:
        return self.start_level == self.end_level

    def level_at(self, dt: float) -> float:
        return self.start_level + (self.end_level - self.start_level) * dt / self.duration_s

    @property
    def area(self) -> float:
        """Integral of the level over the segment (requests, when the level is a rate)."""
        return (self.start_level + self.end_level) / 2 * self.duration_s

    def time_for_area(self, area: float) -> float:
        """Offset into the segment where the integral from its start reaches `area` (<= self.area).
        Solves a + k*t = level, a*t + k*t^2/2 = area, written so k -> 0 does not lose precision."""
        a, k = self.start_level, (self.end_level - self.start_level) / self.duration_s
        if area <= 0:
            return 0.0
        root = math.sqrt(max(a * a + 2 * k * area, 0.0))
        return min(2 * area / (a + root), self.duration_s) if a + root > 0 else self.duration_s


@dataclass(frozen=True)
class Schedule:
    segments: tuple[Segment, ...]

    @property
    def duration_s(self) -> float:
        return sum(s.duration_s for s in self.segments)

    @property
    def max_level(self) -> float:
        return max(max(s.start_level, s.end_level) for s in self.segments)

    def level_at(self, t: float) -> float | None:
        """The level at `t` seconds from the start; None once the schedule is over."""
        if t < 0:
            return self.segments[0].start_level
        for seg in self.segments:
            if t < seg.duration_s:
                return seg.level_at(t)
            t -= seg.duration_s
        return None

    def time_for_area(self, area: float) -> float | None:
        """First time at which the integral of the level reaches `area`; None if it never does."""
        t0 = 0.0
        for seg in self.segments:
            if area <= seg.area and seg.area > 0:
                return t0 + seg.time_for_area(area)
            area -= seg.area
            t0 += seg.duration_s
        return None

    def describe(self) -> str:
        return ",".join(
            f"{_num(s.start_level)}:{_num_s(s.duration_s)}" if s.is_hold
            else f"{_num(s.start_level)}-{_num(s.end_level)}:{_num_s(s.duration_s)}"
            for s in self.segments)


def _num(x: float) -> str:
    return f"{x:g}"


def _num_s(x: float) -> str:
    return f"{x:g}s"


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)?")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """`90`, `90s`, `2m`, `1m30s`, `500ms`, `1.5h` -> seconds. Raises ValueError."""
    text = text.strip().lower()
    pos, total = 0, 0.0
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if not m or (m.group(2) is None and m.end() != len(text)):
            raise ValueError(f"bad duration {text!r} (examples: 45s, 2m, 1m30s, 500ms)")
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if not text:
        raise ValueError("empty duration")
    return total


def _parse_level(text: str, mode: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"level {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"level {text!r} must be a number >= 0")
    if mode == "closed" and value != int(value):
        raise ValueError(f"concurrency {text!r} must be a whole number (closed loop)")
    return value


def parse_ramp(spec: str, mode: str = "closed") -> Schedule:
    """Parse a --ramp spec (see the module docstring). Raises RampError."""
    if mode not in MODES:
        raise RampError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    parts = [p.strip() for p in spec.split(",")]
    if not spec.strip() or not all(parts):
        raise RampError(f"ramp {spec!r}: empty segment; expected e.g. '1:30s,1-32:2m,32:1m'")
    segments = []
    for i, part in enumerate(parts, 1):
        try:
            levels, sep, dur = part.partition(":")
            if not sep:
                raise ValueError("expected LEVEL:DURATION or FROM-TO:DURATION")
            lo, dash, hi = levels.partition("-")
            start = _parse_level(lo.strip(), mode)
            end = _parse_level(hi.strip(), mode) if dash else start
            duration = parse_duration(dur)
            if duration <= 0:
                raise ValueError("duration must be > 0")
        except ValueError as exc:
            raise RampError(f"ramp segment {i} {part!r}: {exc}") from None
        segments.append(Segment(start, end, duration))
    schedule = Schedule(tuple(segments))
    if schedule.max_level <= 0:
        raise RampError(f"ramp {spec!r}: every level is 0, nothing would be sent")
    return schedule


def arrival_times(schedule: Schedule, process: str = "poisson",
                  rng: random.Random | None = None) -> Iterator[float]:
    """Open-loop send times (seconds from start) for a schedule of rates. Maps a unit-rate
    process through the integrated rate, so a changing rate needs no approximation: Poisson
    takes Exp(1) steps, uniform steps of exactly 1 (starting at 0.5, half a gap in)."""
    if process not in ARRIVALS:
        raise ValueError(f"unknown arrival process {process!r}; expected one of {', '.join(ARRIVALS)}")
    rng = rng or random.Random()
    area = 0.5 if process == "uniform" else rng.expovariate(1.0)
    while (t := schedule.time_for_area(area)) is not None:
        yield t
        area += 1.0 if process == "uniform" else rng.expovariate(1.0)


# One request: the driver passes a running index; the callable records the result itself.
SendFn = Callable[[int], Awaitable[None]]


async def run_closed(schedule: Schedule, send: SendFn, stop: asyncio.Event,
                     clock: Callable[[], float] = time.perf_counter) -> int:
    """Closed loop following `schedule`: `round(level)` workers, each sending back-to-back.
    Returns when the schedule is over (or `stop` is set) and every worker has finished its
    current request. Returns the number of requests sent."""
    t0 = clock()
    target = 0
    workers: dict[int, asyncio.Task[None]] = {}
    sent = 0

    async def worker(k: int) -> None:
        nonlocal sent
        while k < target and not stop.is_set():
            index, sent = sent, sent + 1
            await send(index)

    try:
        while not stop.is_set():
            level = schedule.level_at(clock() - t0)
            if level is None:
                break
            target = math.floor(level + 0.5)
            for k in range(target):
                if k not in workers or workers[k].done():
                    workers[k] = asyncio.create_task(worker(k))
            await _wait(stop, TICK_S)
        target = 0   # workers stop after their current request
        await asyncio.gather(*workers.values())
    finally:
        await _cancel(workers.values())   # live tasks are left only when we were cancelled
    return sent


async def run_open(schedule: Schedule, send: SendFn, stop: asyncio.Event, *,
                   max_in_flight: int, process: str = "poisson", rng: random.Random | None = None,
                   on_drop: Callable[[float], None] | None = None,
                   clock: Callable[[], float] = time.perf_counter) -> int:
    """Open loop following `schedule` (requests/s). An arrival finding `max_in_flight` requests
    running is dropped (`on_drop(time)`), so a slow server cannot pile up unbounded work here.
    Returns after the last arrival and once the requests in flight have finished."""
    if max_in_flight < 1:
        raise ValueError("max_in_flight must be >= 1")
    t0 = clock()
    tasks: set[asyncio.Task[None]] = set()
    sent = 0
    try:
        for t in arrival_times(schedule, process, rng):
            delay = t0 + t - clock()
            if delay > 0 and await _wait(stop, delay):
                break
            if stop.is_set():
                break
            if len(tasks) >= max_in_flight:
                if on_drop is not None:
                    on_drop(clock())
                continue
            task = asyncio.create_task(send(sent))
            sent += 1
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        else:   # no more arrivals; a trailing pause (rate 0) still runs: it shows the scale-down
            remaining = t0 + schedule.duration_s - clock()
            if remaining > 0:
                await _wait(stop, remaining)
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        await _cancel(tasks)
    return sent


async def _cancel(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel the tasks still running and wait for them, so their streams close before the
    HTTP client does."""
    live = [t for t in tasks if not t.done()]
    for task in live:
        task.cancel()
    await asyncio.gather(*live, return_exceptions=True)


async def _wait(event: asyncio.Event, timeout: float) -> bool:
    """Sleep up to `timeout` seconds; True if `event` was set meanwhile."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
        return True
    except asyncio.TimeoutError:
        return event.is_set()
