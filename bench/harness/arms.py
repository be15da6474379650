"""Benchmarks that compare configurations of one server ("arms") side by side: every arm's server is started
once, then the arms take turns, the idle ones paused (SIGSTOP), so what the machine does from one minute to
the next falls on every arm alike."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from .run import ROOT, comma_names


class ArmServer(Protocol):
    def start(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def stop(self) -> None: ...


def turn_order(arms: list[str], rounds: int) -> list[str]:
    """A B, B A, A B ...: each round reverses the last, so neither arm always follows the other."""
    out: list[str] = []
    for r in range(rounds):
        out += arms if r % 2 == 0 else list(reversed(arms))
    return out


def take_turns(arms: list[str], rounds: int, make: Callable[[str], ArmServer],
               segment: Callable[[str, Any, int], dict[str, Any]],
               ready: Callable[[Any], None] = lambda server: None,
               ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
    """Each arm's server made (`make`), started and readied (`ready`: a warm-up), then paused; then `rounds`
    turns each in `turn_order`, `segment(arm, server, n)` measuring one (n: the turn's index). Returns each
    arm's segments and why an arm failed; the servers are stopped whatever happens. An arm that does not
    start is reported and the others still run; Ctrl-C ends the run with what it has."""
    servers: dict[str, Any] = {}
    segments: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    failures: dict[str, str] = {}
    try:
        for arm in arms:
            server = make(arm)
            servers[arm] = server
            try:
                server.start()
                ready(server)
            except Exception as exc:  # noqa: BLE001 - report the other arm anyway
                failures[arm] = f"not started: {type(exc).__name__}: {exc}".splitlines()[0]
                server.stop()
                del servers[arm]
                continue
            server.pause()
        for n, arm in enumerate(turn_order([a for a in arms if a in servers], rounds)):
            server = servers[arm]
            server.resume()
            try:
                segments[arm].append(segment(arm, server, n))
            finally:
                server.pause()
    except KeyboardInterrupt:
        failures["interrupted"] = "the run was interrupted; the table is partial"
    finally:
        for server in servers.values():
            server.stop()
    return segments, failures


def arms_parser(prog: str, doc: str, arms: Mapping[str, str], rounds: int) -> argparse.ArgumentParser:
    """A bench's parser with the options every arms bench has: --arms (all by default), --rounds, --timeout, --out."""
    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arms", default=",".join(arms), type=comma_names(arms), help="comma-separated, from: "
                   + ", ".join(arms))
    p.add_argument("--rounds", type=int, default=rounds, help="segments per arm (the order alternates)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results")
    return p
