"""Prometheus' text exposition format, read line by line to keep some series: what /metrics serves of a node's
export (app/http/metrics_page.py). Not a general parser: it keeps a line only when it reads it whole (a comment of
a kept family, or a sample whose labels it could read), so a line it cannot read is left out, never passed on
half-understood."""

from __future__ import annotations

import re
from collections.abc import Callable

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?[ \t]+(\S+)(?:[ \t]+(\S+))?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_COMMENT = re.compile(r"^#\s+(HELP|TYPE)\s+([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\s|$)")
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def labels_of(text: str) -> dict[str, str] | None:
    """The labels of a sample's `{...}` (without the braces); None when they do not read as labels."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        match = _LABEL.match(text, pos)
        if match is None or match.end() == pos:
            return None if text[pos:].strip() else out
        out[match.group(1)] = re.sub(r'\\[\\"n]', lambda m: _ESCAPES[m.group(0)], match.group(2))
        pos = match.end()
    return out


Keep = Callable[[str, dict[str, str]], bool]
"""Whether a sample is kept: (metric name, its labels) -> bool."""


def select(text: str, families: Callable[[str], bool], keep: Keep) -> str:
    """The lines of `text` (an exposition) of the metric families `families(name)` accepts: their HELP and TYPE
    comments, and their samples that `keep(name, labels)` accepts."""
    out: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            comment = _COMMENT.match(line)
            if comment is not None and families(comment.group(2)):
                out.append(line)
            continue
        sample = _SAMPLE.match(line)
        if sample is None or not families(sample.group(1)):
            continue
        labels = labels_of(sample.group(2) or "")
        if labels is not None and keep(sample.group(1), labels):
            out.append(line)
    return "\n".join(out) + "\n" if out else ""
