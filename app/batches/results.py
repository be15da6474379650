"""A batch's results: each line's outcome written in chunks, each chunk one object written atomically, and read
back as the set of lines answered. A line is sent only when no chunk holds it, and when two chunks hold one line
(two runners at once, an old one not yet dead) the first chunk's result is the one read, so every `custom_id` is
answered exactly once in what a client gets, across any restart.

A chunk is JSON lines in the store's own form (`LineResult`); the protocols' forms are made from it when a batch
ends (OpenAI's output and error files) or is read (a Message Batch's results)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from ..api import strict_json
from .records import batch_dir
from .store import BatchStore

SUCCEEDED, ERRORED, CANCELLED, EXPIRED = "succeeded", "errored", "cancelled", "expired"

# What a line never run says, in OpenAI's error file.
_NOT_RUN = {
    CANCELLED: ("batch_cancelled", "This request was not executed because the batch was cancelled."),
    EXPIRED: ("batch_expired", "This request could not be executed before the completion window expired."),
}


@dataclass
class LineResult:
    line: int
    custom_id: str
    outcome: str  # succeeded, errored, cancelled, expired
    status_code: int | None = None  # the answer's status; None when the line got no answer
    body: dict[str, Any] | None = None  # the answer: the endpoint's body, or its error body in its protocol's shape
    error: dict[str, Any] | None = None  # {"code", "message"} of a line that got no answer
    request_id: str = ""
    usage: tuple[int, int, int] = (0, 0, 0)  # input, cached input, output tokens

    def to_json(self) -> bytes:
        return strict_json.dumps_bytes(asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "LineResult":
        data["usage"] = tuple(data.get("usage") or (0, 0, 0))
        return cls(**data)

    # -- the protocols' forms ----------------------------------------------------------------------------------
    def to_openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": f"batch_req_{self.request_id}", "custom_id": self.custom_id, "response": None,
                               "error": None}
        if self.status_code is not None:
            out["response"] = {"status_code": self.status_code, "request_id": self.request_id, "body": self.body}
        elif self.outcome in _NOT_RUN:
            code, message = _NOT_RUN[self.outcome]
            out["error"] = {"code": code, "message": message}
        else:
            out["error"] = self.error
        return out

    def to_anthropic(self) -> dict[str, Any]:
        if self.outcome == SUCCEEDED:
            result: dict[str, Any] = {"type": "succeeded", "message": self.body}
        elif self.outcome == ERRORED:
            result = {"type": "errored", "error": self.body}
        else:
            result = {"type": "canceled" if self.outcome == CANCELLED else "expired"}
        return {"custom_id": self.custom_id, "result": result}


def usage_of(body: dict[str, Any] | None) -> tuple[int, int, int]:
    """Input, cached input and output tokens of an answer, in any of the protocols' usage shapes."""
    usage = (body or {}).get("usage")
    if not isinstance(usage, dict):
        return (0, 0, 0)
    given = usage.get("prompt_tokens", usage.get("input_tokens", 0))
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    cached = details.get("cached_tokens", 0) if isinstance(details, dict) else 0
    cached = cached or usage.get("cache_read_input_tokens", 0) or 0
    made = usage.get("completion_tokens", usage.get("output_tokens", 0))
    return tuple(v if isinstance(v, int) and v >= 0 else 0 for v in (given, cached, made))  # type: ignore[return-value]


@dataclass
class Answered:
    """What the chunks say so far: each answered line's outcome and usage."""

    lines: dict[int, tuple[str, tuple[int, int, int]]]
    next_seq: int

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys((SUCCEEDED, ERRORED, CANCELLED, EXPIRED), 0)
        for outcome, _ in self.lines.values():
            counts[outcome] += 1
        return counts

    def usage(self) -> dict[str, int]:
        given = cached = made = 0
        for _, (g, c, m) in self.lines.values():
            given, cached, made = given + g, cached + c, made + m
        return {"input_tokens": given, "cached_tokens": cached, "output_tokens": made}


class ResultChunks:
    """The chunks of one batch in the store (blocking calls: run them in a thread). `writer`: this runner's mark
    in its chunks' names, so two runners never write the same name."""

    def __init__(self, store: BatchStore, owner: str, batch_id: str) -> None:
        self.store = store
        self.folder = f"{batch_dir(owner, batch_id)}/results"
        self.writer = secrets.token_hex(4)
        self.seq = 0

    def _chunks(self) -> list[str]:
        return [n for n in self.store.names(self.folder) if n.endswith(".jsonl")]

    def answered(self) -> Answered:
        lines: dict[int, tuple[str, tuple[int, int, int]]] = {}
        last = -1
        for name in self._chunks():
            last = max(last, int(name.split("-", 1)[0]))
            for result in self._read(name):
                lines.setdefault(result.line, (result.outcome, result.usage))
        self.seq = last + 1
        return Answered(lines, self.seq)

    def write(self, results: list[LineResult]) -> None:
        """One chunk, whole or not at all."""
        if not results:
            return
        blob = b"".join(r.to_json() + b"\n" for r in results)
        self.store.put(f"{self.folder}/{self.seq:010d}-{self.writer}.jsonl", blob)
        self.seq += 1

    def results(self) -> Iterator[LineResult]:
        """Every line's result once, the first chunk's where two hold it (memory: one chunk, a set of lines)."""
        seen: set[int] = set()
        for name in self._chunks():
            for result in self._read(name):
                if result.line not in seen:
                    seen.add(result.line)
                    yield result

    def _read(self, name: str) -> Iterator[LineResult]:
        blob = self.store.get(f"{self.folder}/{name}") or b""
        for line in blob.splitlines():
            if line.strip():
                yield LineResult.from_dict(json.loads(line))
