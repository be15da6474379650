"""Value types produced by the parsers."""
from __future__ import annotations

import secrets
import string
from dataclasses import dataclass
from typing import Literal

_ALNUM = string.ascii_letters + string.digits


def new_call_id() -> str:
    """OpenAI-style tool call id: ``call_`` + 24 random alphanumerics."""
    return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))


@dataclass(frozen=True, slots=True)
class Delta:
    """A piece of reasoning or content text."""

    kind: Literal["reasoning", "content"]
    text: str


@dataclass(frozen=True, slots=True)
class CallDelta:
    """A piece of a tool call, OpenAI streaming shape.

    The first delta of a call has ``id`` and ``name`` set; later ones only
    ``index`` and an ``arguments`` fragment.
    """

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def to_openai(self) -> dict:
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {
            "index": self.index,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as a string

    def to_openai(self) -> dict:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


ToolDelta = Delta | CallDelta
