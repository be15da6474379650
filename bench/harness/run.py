"""A bench command's plumbing: where the repository and the venv are, its output folder, log lines, the
comma-separated names its options take, a free port, the `llamaray` CLI run from this checkout."""

from __future__ import annotations

import argparse
import random
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


# Ports for the servers a bench or a test starts: drawn from 20000-29999, which neither the kernel hands out for
# outgoing or port-0 sockets (32768-60999 by default) nor Ray takes (its workers 10002-19999, Serve's direct ingress
# 30000 and 40000 up). A port the kernel chose for us and we released could be taken by one of Ray's own sockets
# before HAProxy bound it (a CI run failed so). Random, so two sessions on one machine rarely draw the same one.
PORT_RANGE = (20000, 29999)


def free_port() -> int:
    """A port nothing listens on now, on any interface (HAProxy binds 0.0.0.0)."""
    for _ in range(200):
        port = random.randint(*PORT_RANGE)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {PORT_RANGE}")


def run_cli(cmd: list) -> None:
    """A command (the `llamaray` CLI: render-config, check-config) run in the checkout; its output on failure."""
    res = subprocess.run([str(c) for c in cmd], cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed:\n{res.stdout}{res.stderr}")
