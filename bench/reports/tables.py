"""What the benches' reports share: a figure or "-", aligned text columns, and a run's JSON record."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def fmt(v: float | None, spec: str = ".0f") -> str:
    """A figure in `spec`, or "-" where there is none (None, NaN)."""
    return "-" if v is None or v != v else format(v, spec)


def text_table(head: Sequence[str], body: Sequence[Sequence[str]], left: Sequence[int] = (0,)) -> list[str]:
    """Lines of a table with a rule under its head: columns as wide as their widest cell, those in `left`
    aligned left, the others right."""
    widths = [max(len(x) for x in col) for col in zip(head, *body)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return [line(head), line(["-" * w for w in widths])] + [line(b) for b in body]


def write_json(path: Path, data: dict[str, Any], indent: int = 2) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent, default=str) + "\n")


def write_run(path: Path, ns: argparse.Namespace, **data: Any) -> None:
    """A run's record: when, on how many CPUs, with which options, then `data`; says where it went."""
    write_json(path, {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "cpus": os.cpu_count(),
                      "args": {k: str(v) for k, v in vars(ns).items()}, **data}, indent=1)
    print(f"\nwrote {path}", flush=True)
