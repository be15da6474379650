"""Linux's /proc as the bench and the test harness read it: the live pids, a process's stat fields and its
command line, a process that ends while being read coming back as None."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

PROC = Path("/proc")


def pids(proc: Path = PROC) -> Iterator[int]:
    for entry in proc.iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


def stat_fields(text: str) -> list[str]:
    """The fields of a /proc/<pid>/stat text after the command name: [0] is proc(5)'s field 3 (state), [1] the
    parent, [3] the session, [11] and [12] utime and stime. The name in parentheses may hold spaces and
    parentheses itself, so the fields are counted after the last ')'."""
    return text.rsplit(")", 1)[1].split()


def read_stat(pid: int, proc: Path = PROC) -> list[str] | None:
    try:
        return stat_fields((proc / str(pid) / "stat").read_text())
    except (OSError, IndexError):
        return None


def read_cmdline(pid: int, proc: Path = PROC) -> bytes | None:
    """The command line, its arguments separated by NUL bytes."""
    try:
        return (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
