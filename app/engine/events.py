"""What the engine says about one generation, as typed values that cross both Ray hops unchanged.

A generation is `Started`, then any number of `Text`, then `Finished` or `Failed`. A request for n
choices is n such generations in one stream, told apart by `index` (a `Failed` fails them all).
`PromptLogprobs` comes once the prompt is decoded, when the request asked for the prompt's scores.
The engine makes them on its decode thread; stream.py hands them to the event loop; the LlamaModel replica streams
lists of them to the ChatProcessor, which turns them into OpenAI chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Union

from .errors import EngineError


class _Picklable:
    """Frozen slotted dataclasses pickle by their fields (Python 3.10's default cannot unpickle them)."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return type(self), tuple(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True, slots=True)
class TokenLogprob(_Picklable):
    """One token's log-probability under the model's own distribution (before penalties, bias,
    temperature and truncation), and the `top` most likely tokens at that position."""

    token: bytes                           # the token's text (a piece may be part of a UTF-8 character)
    logprob: float | None                  # None: the prompt's first token (nothing predicted it)
    top: tuple[tuple[bytes, float], ...]   # most likely first


@dataclass(frozen=True, slots=True)
class Started(_Picklable):
    prompt_tokens: int
    cached_tokens: int  # prompt tokens whose KV was reused
    index: int = 0      # the choice
    queued_s: float = 0.0  # how long it waited for a slot (submitted -> admitted), by the engine's clock
    cached_from: str = ""  # where the reused KV came from: slot, memory, disk, cluster ("" for nothing)


@dataclass(frozen=True, slots=True)
class Text(_Picklable):
    text: str
    tokens: int  # tokens that produced it (0 for text held back and released later)
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token, when the request asked for them
    index: int = 0

    def joined(self, other: "Text") -> "Text":
        return Text(self.text + other.text, self.tokens + other.tokens, self.logprobs + other.logprobs, self.index)


@dataclass(frozen=True, slots=True)
class PromptLogprobs(_Picklable):
    entries: tuple[TokenLogprob, ...]  # one per prompt token
    index: int = 0


@dataclass(frozen=True, slots=True)
class Finished(_Picklable):
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    index: int = 0
    # The generated ids, only when the request asked (return_tokens: a reply that may be continued, /infill's
    # `tokens`); empty otherwise, so the event stays small.
    token_ids: tuple[int, ...] = ()
    stop_sequence: str | None = None  # the client's stop sequence that ended it (finish_reason "stop")
    # Generated tokens that were reasoning (its markers and a forced close included), as the engine counted them
    # (app/engine/reasoning_budget.py); 0 where the request tracks no reasoning.
    reasoning_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Failed(_Picklable):
    error: EngineError  # the protocol's error is made from it where the stream reaches the processing


Event = Union[Started, Text, PromptLogprobs, Finished, Failed]


def coalesce(events: list[Event]) -> list[Event]:
    """Adjacent Text events of one choice joined into one (fewer items through each Ray hop)."""
    out: list[Event] = []
    for ev in events:
        if isinstance(ev, Text) and out and isinstance(out[-1], Text) and out[-1].index == ev.index:
            out[-1] = out[-1].joined(ev)
        else:
            out.append(ev)
    return out
