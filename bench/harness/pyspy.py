"""py-spy on a server's processes, and each thread's CPU from /proc beside it: the samplers (an SVG flame graph
and the raw stacks per process), py-spy's collapsed stacks read back, and a summary of where the samples went
(per thread, and the functions on the most samples). Used by `python -m bench.profile` and by `python -m
bench.graph --profile RATE`."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

from .procs import parse_stat
from .run import VENV_BIN


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds each thread of `pid` has used, by `name (tid)`: what the threads really ran, where py-spy's
    non-blocking samples count a thread waiting in native code (Ray's core worker, epoll) as busy."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            _, cpu_s = parse_stat((task / "stat").read_text())
            name = (task / "comm").read_text().strip()
        except (OSError, IndexError, ValueError):
            continue
        out[f"{name} ({task.name})"] = cpu_s
    return out


def collapsed(path: Path) -> Counter[str]:
    """py-spy's raw output: one `frame;frame;...;leaf count` line per distinct stack."""
    stacks: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            stacks[stack] += int(n)
    return stacks


def frame_name(frame: str) -> str:
    """`fn (path/to/file.py:123)` -> `fn (file.py)`: one entry per function, whatever its line."""
    fn, _, where = frame.partition(" (")
    return f"{fn} ({Path(where.rstrip(')').rsplit(':', 1)[0]).name})" if where else fn


def summarise(stacks: Counter[str], top: int = 25) -> list[str]:
    """Samples per thread, then the functions on the most samples (each counted once per stack)."""
    total = sum(stacks.values()) or 1
    threads: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for stack, n in stacks.items():
        frames = stack.split(";")
        threads[frames[0]] += n
        for name in {frame_name(f) for f in frames[1:]}:
            inclusive[name] += n
    lines = [f"  {n:6d} samples  {100 * n / total:5.1f}%  {t}" for t, n in threads.most_common()]
    lines.append("  functions (inclusive):")
    lines += [f"  {n:6d} samples  {100 * n / total:5.1f}%  {f}" for f, n in inclusive.most_common(top)]
    return lines


def record(pid: int, seconds: float, out: Path, rate: int) -> list[subprocess.Popen]:
    """Two samplers on one process (py-spy writes one format per run): an SVG and the raw stacks."""
    base = [str(VENV_BIN / "py-spy"), "record", "--pid", str(pid), "--duration", str(int(seconds)),
            "--rate", str(rate), "--threads", "--nonblocking"]
    return [subprocess.Popen([*base, "--format", fmt, "--output", str(out.with_suffix(ext))],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for fmt, ext in (("flamegraph", ".svg"), ("raw", ".txt"))]
