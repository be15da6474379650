"""Live one-line progress on stderr: rewritten in place (`\\r`) about twice a second on a
terminal; otherwise (a log file, CI, or --no-progress) one plain line every 10 seconds."""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from collections.abc import Callable
from typing import TextIO

from .report import RunLog, short_names

TTY_INTERVAL_S = 0.5
PLAIN_INTERVAL_S = 10.0
WINDOW_S = 5.0


def _clock(seconds: float) -> str:
    m, s = divmod(int(max(seconds, 0)), 60)
    return f"{m}:{s:02d}"


def replicas_summary(log: RunLog) -> str:
    """`Ingress 1 ChatProcessor 1 LlamaModel-x 2+1` (+n: replicas starting); '-' without data."""
    sample = log.latest_replicas
    if not sample:
        return "-"
    names = short_names(sample)
    return " ".join(f"{names[k]} {d.running}" + (f"+{d.starting}" if d.starting else "")
                    for k, d in sample.items())


def status_line(log: RunLog, now: float, *, level_unit: str, draining: bool = False) -> str:
    elapsed = now - log.t0
    level = log.schedule.level_at(elapsed)
    if level is None or draining:
        load = "draining"
    elif level_unit == "concurrency":
        load = f"c={int(level + 0.5)}"
    else:
        load = f"rate={level:.2f}/s"
    tok_s, ttft = log.window(now, WINDOW_S)
    ttft_txt = "-" if ttft is None else f"{ttft * 1000:.0f}ms"
    done = len(log.results) - log.n_failed
    parts = [
        f"[{_clock(elapsed)}/{_clock(log.schedule.duration_s)}]",
        load,
        f"in-flight {len(log.in_flight)}",
        f"done {done}",
        f"failed {log.n_failed}",
    ]
    if log.drops:
        parts.append(f"dropped {len(log.drops)}")
    parts += [f"| {tok_s:.0f} tok/s", f"ttft p50 {ttft_txt}", f"| replicas {replicas_summary(log)}"]
    return " ".join(parts)


class Progress:
    def __init__(self, log: RunLog, *, level_unit: str, enabled: bool = True,
                 stream: TextIO | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.log = log
        self.level_unit = level_unit
        self.stream = stream if stream is not None else sys.stderr
        self.live = enabled and self.stream.isatty()
        self.clock = clock
        self.draining = False
        self._width = 0

    def render(self) -> None:
        line = status_line(self.log, self.clock(), level_unit=self.level_unit, draining=self.draining)
        if not self.live:
            print(line, file=self.stream, flush=True)
            return
        # A line longer than the terminal wraps, and \r then only rewinds its last row.
        cols = shutil.get_terminal_size((120, 24)).columns - 1
        line = line[:cols]
        self.stream.write("\r" + line + " " * max(self._width - len(line), 0))
        self.stream.flush()
        self._width = len(line)

    def message(self, text: str) -> None:
        """A line of its own, without garbling the live line."""
        if self.live and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self._width = 0
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.live and self._width:
            self.render()
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0

    async def run(self, stop: asyncio.Event) -> None:
        interval = TTY_INTERVAL_S if self.live else PLAIN_INTERVAL_S
        while True:
            try:
                await asyncio.wait_for(stop.wait(), interval)
                return
            except asyncio.TimeoutError:
                self.render()
