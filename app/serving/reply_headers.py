"""HTTP headers an answer goes out with that the processing decides (a key's rate-limit state, as OpenAI's and
Anthropic's APIs send it on every answer so clients can pace themselves), carried to the Ingress over whichever
road the answer takes: a whole answer as `WithHeaders`, a stream's as a `StreamHeaders` item at the head of its
first batch (the "accepted" one; batches joined on the way keep their order, so it stays first)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WithHeaders:
    """A whole answer's body and its headers."""

    body: dict[str, Any]
    headers: dict[str, str]


@dataclass(frozen=True)
class StreamHeaders:
    """A stream's headers: the first item of its first batch."""

    headers: dict[str, str]


def split_headers(batch: Any) -> tuple[dict[str, str], Any]:
    """(the headers a stream's first batch leads with, the batch without them)."""
    if isinstance(batch, list) and batch and isinstance(batch[0], StreamHeaders):
        return batch[0].headers, batch[1:]
    return {}, batch
