"""A bench command's plumbing: where the repository and the venv are, its output folder, log lines, the
comma-separated names its options take, a free port, the `llamaray` CLI run from this checkout."""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def comma_names(known: Iterable[str]) -> Callable[[str], list[str]]:
    """An argparse `type`: a comma-separated list whose every name is one of `known`."""
    known = list(known)

    def parse(value: str) -> list[str]:
        names = [n.strip() for n in value.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; known: {', '.join(known)}")
        return names
    return parse


def start_run(out: Path) -> Path:
    """A bench command's start: its output folder with logs/ (returned), and SIGTERM (from make or a
    CI runner) unwinding like Ctrl-C, so every server it started is stopped."""
    log_dir = out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    return log_dir


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(cmd: list) -> None:
    """A command (the `llamaray` CLI: render-config, check-config) run in the checkout; its output on failure."""
    res = subprocess.run([str(c) for c in cmd], cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed:\n{res.stdout}{res.stderr}")
