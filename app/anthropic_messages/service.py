"""MessagesService: Anthropic's Messages API over chat's pipeline. A request is mapped to the chat request
it means and planned as chat plans it; the reply is read by chat's parsers, as ChatReply reads it, and only
shaped differently: a `message` for a whole reply, Anthropic's events for a stream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ..generation.plan import GenerationPlan
from ..chat.service import ChatReply, ChatService
from ..config.settings import ModelSpec
from ..engine.events import Event
from ..observe.request_records import RequestRecord
from .events import MessageEvents
from .mapping import to_chat_request
from .schemas import MessagesRequest
from .shaping import Totals, message_body, message_id


class MessagesReply:
    """A chat reply (one choice) shaped as Anthropic's: its body a `message`, its chunks stream events."""

    def __init__(self, plan: GenerationPlan, stream: bool) -> None:
        self.chat = ChatReply(plan, stream)
        self.tally = self.chat.choices[0].tally
        self.events = MessageEvents(message_id(plan.gen.request_id), plan.req.model, self.totals) if stream else None

    def totals(self) -> Totals:
        t = self.tally
        return Totals(prompt_tokens=t.prompt_tokens, cached_tokens=t.cached_tokens,
                      completion_tokens=t.completion_tokens, stop_sequence=t.stop_sequence)

    def read(self, batch: tuple[int, list[Event]]) -> None:
        self.chat.read(batch)

    def check(self) -> None:
        self.chat.check()

    def body(self) -> dict[str, Any]:
        return message_body(self.chat.body(), self.totals())

    def chunks(self, batch: tuple[int, list[Event]]) -> list[dict[str, Any]]:
        return [event for chunk in self.chat.chunks(batch) for event in self.events.feed(chunk)]

    def usage_chunk(self) -> dict[str, Any]:
        raise NotImplementedError("a message stream's usage is in its message_delta event")

    def record(self, protocol: str, stream: bool, failure: BaseException | None) -> RequestRecord:
        return self.chat.record(protocol, stream, failure)


class MessagesService(ChatService):
    """Chat's lifecycle, planning and generation rounds, recorded under the protocol `messages`."""

    protocol = "messages"

    def make_plan(self, req: MessagesRequest, spec: ModelSpec, scope: str) -> GenerationPlan:  # type: ignore[override]
        mapped = to_chat_request(req)
        return self.plan_chat(mapped.chat, spec, scope, mapped.template_kwargs)

    def reply(self, plan: GenerationPlan, stream: bool) -> MessagesReply:  # type: ignore[override]
        return MessagesReply(plan, stream)

    def events(self, plan: GenerationPlan, reply: MessagesReply) -> AsyncIterator[tuple[int, list[Event]]]:  # type: ignore[override]
        return super().events(plan, reply.chat)
