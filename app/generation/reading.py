"""A chat-shaped reply read from its model events, in no protocol's shape: each choice's text through its own
parser (reasoning, content, tool calls), its tally and its logprobs; a whole reply as one `ChoiceResult` per
choice, a stream as `Opened` / `Delta` / `Closed` events. Each protocol shapes these into its own body and
chunks (chat completions, Responses, Messages)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Union

from ..api.errors import empty_reply
from ..engine.events import Event, Finished, Started, Text, TokenLogprob
from ..observe.request_records import RequestRecord
from .plan import GenerationPlan
from .tally import ReplyTally


@dataclass(frozen=True, slots=True)
class Opened:
    """A choice's reply began (its model started)."""

    index: int


@dataclass(frozen=True, slots=True)
class Delta:
    """A parsed piece of a choice's reply: the parser's delta (`content`, `reasoning_content` or `tool_calls`),
    with the logprobs of the tokens since the last piece sent (None: none, or none asked for)."""

    index: int
    delta: dict[str, Any]
    logprobs: list[TokenLogprob] | None


@dataclass(frozen=True, slots=True)
class Closed:
    """A choice's reply ended: why (`finish_reason`), and the logprobs no piece carried yet."""

    index: int
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None


ReplyEvent = Union[Opened, Delta, Closed]


@dataclass(frozen=True, slots=True)
class ChoiceResult:
    """A whole choice: its parsed message (`content`, `reasoning_content`, `tool_calls`), why it ended, and
    its logprobs when asked for."""

    message: dict[str, Any]
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None


def finish_reason(made_calls: bool, ended: str | None) -> str | None:
    """`length` whenever the reply was cut, as OpenAI reports it: a call that streamed out before
    the cut keeps the arguments generated so far, so `tool_calls` would claim a whole call. Else
    `tool_calls` when the reply made calls."""
    return "tool_calls" if made_calls and ended != "length" else ended


class ChoiceReading:
    """One choice's reading of the reply: its parser, its tally, and its logprobs when asked for."""

    def __init__(self, plan: GenerationPlan) -> None:
        self.parser = plan.reply_parser()
        self.tally = ReplyTally()
        self.wants_logprobs = plan.gen.logprobs is not None
        self.logprobs: list[TokenLogprob] = []
        self._unsent = 0  # logprobs not yet attached to a piece

    def add_logprobs(self, ev: Text) -> None:
        if self.wants_logprobs:
            self.logprobs.extend(ev.logprobs)

    def unsent_logprobs(self) -> list[TokenLogprob] | None:
        """Logprobs of tokens since the last piece, for the next piece (None: none to send)."""
        fresh = self.logprobs[self._unsent:]
        self._unsent = len(self.logprobs)
        return fresh or None


class ReplyReader:
    """A planned turn's reply, read choice by choice. Batches: (choice index, that choice's events), as
    `GenerationCore.events` yields them (each choice's tally already kept there)."""

    def __init__(self, plan: GenerationPlan) -> None:
        self.plan = plan
        self.choices = [ChoiceReading(plan) for _ in range(plan.gen.n)]
        self.closed = 0  # choices, in a stream

    @property
    def ended(self) -> bool:
        """Every choice of a stream closed."""
        return self.closed == len(self.choices)

    def read(self, batch: tuple[int, list[Event]]) -> None:
        """A batch of a whole reply: only logprobs are kept (the text is parsed whole, in `results`)."""
        index, events = batch
        for ev in events:
            if isinstance(ev, Text):
                self.choices[index].add_logprobs(ev)

    def check(self) -> None:
        """Refused when every choice is empty and its model says `empty_reply: error`."""
        if self.plan.spec.empty_reply == "error" and all(c.tally.empty for c in self.choices):
            raise empty_reply()

    def results(self) -> list[ChoiceResult]:
        """Each choice of a whole reply, parsed."""
        out = []
        for choice in self.choices:
            message = choice.parser.parse(choice.tally.text())
            out.append(ChoiceResult(message, finish_reason(bool(message.get("tool_calls")), choice.tally.finish_reason),
                                    choice.logprobs if choice.wants_logprobs else None))
        return out

    def feed(self, batch: tuple[int, list[Event]]) -> list[ReplyEvent]:
        """A batch of a streamed reply as reply events (raises to end the stream with an error: a reply
        refused as empty, when its last choice closes)."""
        index, events = batch
        choice = self.choices[index]
        out: list[ReplyEvent] = []

        def pieces(deltas: list[dict[str, Any]]) -> None:
            out.extend(Delta(index, d, choice.unsent_logprobs()) for d in deltas)

        for ev in events:
            if isinstance(ev, Started):
                out.append(Opened(index))
            elif isinstance(ev, Text):
                choice.add_logprobs(ev)
                pieces(choice.parser.feed(ev.text))
            elif isinstance(ev, Finished):
                pieces(choice.parser.finish())
                self.closed += 1
                if self.ended:
                    self.check()  # refused: the protocol's error replaces its final chunk
                out.append(Closed(index, finish_reason(choice.parser.made_tool_calls, choice.tally.finish_reason),
                                  choice.unsent_logprobs()))
        return out

    def usage(self) -> dict[str, Any]:
        """The reply's usage (chat's names); the prompt is counted once, however many choices share it."""
        out = self.choices[0].tally.usage()
        out["completion_tokens"] = sum(c.tally.completion_tokens for c in self.choices)
        out["total_tokens"] = out["prompt_tokens"] + out["completion_tokens"]
        out["completion_tokens_details"] = {"reasoning_tokens": sum(c.tally.reasoning_tokens for c in self.choices)}
        return out

    def record(self, protocol: str, stream: bool, failure: BaseException | None) -> RequestRecord:
        rec = self.choices[0].tally.record(self.plan.spec.id, stream, failure, protocol)
        if len(self.choices) > 1:
            rec = replace(rec, completion_tokens=sum(c.tally.completion_tokens for c in self.choices))
        return rec
