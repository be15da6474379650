"""An Ollama turn's reply, read from its model events: the core's reading of a templated turn (`TurnReply`), or a raw
generation's text (`RawReply`), as Ollama's records (shaping.py), the final one with the counts and durations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..completions.service import CompletionPlan
from ..engine.events import Event, Finished, Started, Text
from ..generation.plan import GenerationPlan
from ..generation.reading import Closed, Delta, ReplyReader
from ..generation.tally import ReplyTally
from ..observe.request_records import RequestRecord
from .schemas import OllamaChatRequest, _Generating
from .shaping import chat_record, final_fields, generate_record, message, ollama_tool_calls

InnerPlan = TypeVar("InnerPlan", GenerationPlan, CompletionPlan)


@dataclass(frozen=True)
class OllamaPlan(Generic[InnerPlan]):
    """A planned Ollama turn: the core's (or the completions') plan, and what its records need."""

    inner: InnerPlan
    req: _Generating
    received_at: float  # when the request reached the processing (total_duration counts from it)

    @property
    def chat(self) -> bool:
        return isinstance(self.req, OllamaChatRequest)


class ReplyRecords:
    """What both replies share: the request's name and shape, the slot wait the engine reported, and the records."""

    def __init__(self, plan: OllamaPlan[Any], tally: ReplyTally) -> None:
        self.plan = plan
        self.tally = tally
        self.queued_s: float | None = None

    def saw(self, events: list[Any]) -> None:
        for ev in events:
            if isinstance(ev, Started) and self.queued_s is None:
                self.queued_s = ev.queued_s

    def line(self, text: str = "", thinking: str | None = None, calls: list[dict[str, Any]] | None = None,
             **fields: Any) -> dict[str, Any]:
        """One record of the reply (`fields`: the final record's)."""
        name = self.plan.req.name
        if self.plan.chat:
            return chat_record(name, message(text, thinking, calls), **fields)
        return generate_record(name, text, thinking, **fields)

    def final(self, finish_reason: str | None, text: str = "", thinking: str | None = None,
              calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return self.line(text, thinking, calls, **final_fields(self.tally, self.plan.received_at,
                                                                 self.queued_s or 0.0, finish_reason))


class TurnReply(ReplyRecords):
    """A templated turn (/api/chat, /api/generate): the core's reading of one choice as Ollama's records. A stream
    sends text and thinking as they are parsed, and a call whole, once its arguments are (Ollama's clients read
    `arguments` as an object)."""

    def __init__(self, plan: OllamaPlan[GenerationPlan]) -> None:
        self.reader = ReplyReader(plan.inner)
        super().__init__(plan, self.reader.choices[0].tally)
        self.calls: dict[int, dict[str, Any]] = {}  # a stream's calls by index, arguments as generated so far

    def read(self, batch: tuple[int, list[Event]]) -> None:
        self.saw(batch[1])
        self.reader.read(batch)

    def check(self) -> None:
        self.reader.check()

    def body(self) -> dict[str, Any]:
        result = self.reader.results()[0]
        msg = result.message
        calls = ollama_tool_calls(msg.get("tool_calls") or [])
        return self.final(result.finish_reason, msg.get("content") or "", msg.get("reasoning_content"), calls)

    def chunks(self, batch: tuple[int, list[Event]]) -> list[dict[str, Any]]:
        self.saw(batch[1])
        out = []
        for ev in self.reader.feed(batch):
            if isinstance(ev, Delta):
                delta = ev.delta
                if delta.get("content") or delta.get("reasoning_content"):
                    out.append(self.line(delta.get("content") or "", delta.get("reasoning_content")))
                for call in delta.get("tool_calls") or []:
                    self._call(call)
            elif isinstance(ev, Closed):
                if self.calls:
                    calls = [self.calls[i] for i in sorted(self.calls)]
                    out.append(self.line(calls=ollama_tool_calls(calls)))
                out.append(self.final(ev.finish_reason))
        return out

    def _call(self, part: dict[str, Any]) -> None:
        call = self.calls.setdefault(part.get("index", 0), {"id": None, "function": {"name": "", "arguments": ""}})
        if part.get("id") is not None:
            call["id"] = part["id"]
        fn = part.get("function") or {}
        if fn.get("name"):
            call["function"]["name"] = fn["name"]
        call["function"]["arguments"] += fn.get("arguments") or ""

    @property
    def whole(self) -> bool:
        return self.reader.ended

    def tail(self) -> list[dict[str, Any]]:
        return []  # the counts are in the final record

    def record(self, protocol: str, stream: bool, failure: BaseException | None) -> RequestRecord:
        return self.reader.record(protocol, stream, failure)


class RawReply(ReplyRecords):
    """A raw generation (the prompt as it is): the model's text, as it comes, as `response` records. Batches:
    [(prompt number, event)], as the completions service yields them."""

    def __init__(self, plan: OllamaPlan[CompletionPlan]) -> None:
        super().__init__(plan, ReplyTally())
        self.pieces: list[str] = []
        self.finish_reason: str | None = None

    def _take(self, batch: list[tuple[int, Event]], shaped: bool) -> list[dict[str, Any]]:
        self.saw([ev for _, ev in batch])
        out = []
        for _, ev in batch:
            if isinstance(ev, Text) and ev.text:
                self.pieces.append(ev.text)
                if shaped:
                    out.append(self.line(ev.text))
            elif isinstance(ev, Finished):
                self.finish_reason = ev.finish_reason
                if shaped:
                    out.append(self.final(ev.finish_reason))
        return out

    def read(self, batch: list[tuple[int, Event]]) -> None:
        self._take(batch, shaped=False)

    def check(self) -> None:
        """A raw generation is answered as it came out, however empty (as a legacy completion is)."""

    def body(self) -> dict[str, Any]:
        return self.final(self.finish_reason, "".join(self.pieces))

    def chunks(self, batch: list[tuple[int, Event]]) -> list[dict[str, Any]]:
        return self._take(batch, shaped=True)

    @property
    def whole(self) -> bool:
        return self.finish_reason is not None

    def tail(self) -> list[dict[str, Any]]:
        return []

    def record(self, protocol: str, stream: bool, failure: BaseException | None) -> RequestRecord:
        return self.tally.record(self.plan.inner.spec.id, stream, failure, protocol)
