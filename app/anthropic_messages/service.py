"""MessagesService: Anthropic's Messages API as an adapter of the generation core (app/generation/core.py). A
request is mapped to the chat request it means and planned, generated and read by the core as any chat-shaped
turn; what was read is shaped as Anthropic's: a `message` for a whole reply, its events for a stream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ..api.errors import APIError
from ..config.app_args import Limits
from ..config.spec import ModelSpec
from ..engine.events import Event
from ..generation.adapters import Target
from ..generation.caller import ANONYMOUS, Caller
from ..generation.core import GenerationCore
from ..generation.lifecycle import Lifecycle
from ..generation.plan import GenerationPlan
from ..generation.reading import ReplyReader
from ..generation.rounds import Generate
from ..observe.request_records import RequestObserver, RequestRecord
from .events import MessageEvents
from .mapping import to_chat_request
from .schemas import MessagesRequest
from .shaping import Totals, message_body, message_id


class MessagesReply:
    """The core's reading of a reply (one choice) shaped as Anthropic's: its body a `message`, its chunks
    stream events."""

    def __init__(self, plan: GenerationPlan, stream: bool) -> None:
        self.plan = plan
        self.reader = ReplyReader(plan)
        self.tally = self.reader.choices[0].tally
        self.events = MessageEvents(message_id(plan.gen.request_id), plan.req.model, self.totals) if stream else None

    def totals(self) -> Totals:
        t = self.tally
        return Totals(prompt_tokens=t.prompt_tokens, cached_tokens=t.cached_tokens,
                      completion_tokens=t.completion_tokens, stop_sequence=t.stop_sequence)

    def read(self, batch: tuple[int, list[Event]]) -> None:
        self.reader.read(batch)

    def check(self) -> None:
        self.reader.check()

    def body(self) -> dict[str, Any]:
        result = self.reader.results()[0]
        return message_body(message_id(self.plan.gen.request_id), self.plan.req.model, result.message,
                            result.finish_reason, self.totals())

    def chunks(self, batch: tuple[int, list[Event]]) -> list[dict[str, Any]]:
        return [event for ev in self.reader.feed(batch) for event in self.events.feed(ev)]

    @property
    def whole(self) -> bool:
        return self.reader.ended

    def tail(self) -> list[dict[str, Any]]:
        """Nothing: a message stream's usage is in its message_delta event."""
        return []

    def record(self, protocol: str, stream: bool, failure: BaseException | None) -> RequestRecord:
        return self.reader.record(protocol, stream, failure)


class MessagesService:
    """`/v1/messages`: the core's turn as Anthropic's message, recorded under the protocol `messages`."""

    protocol = "messages"

    def __init__(self, specs: list[ModelSpec], generate: Generate, *, limits: Limits | None = None,
                 observer: RequestObserver | None = None, per_key_cache: bool = True) -> None:
        self.core = GenerationCore(specs, generate, limits=limits, per_key_cache=per_key_cache)
        self.lifecycle: Lifecycle[MessagesRequest, GenerationPlan, MessagesReply] = Lifecycle(self, observer)

    def target(self, req: MessagesRequest, caller: Caller) -> Target:
        return self.core.target(req.model, "/v1/messages", caller)

    def make_plan(self, req: MessagesRequest, spec: ModelSpec, scope: str) -> GenerationPlan:
        """The request mapped to its chat request and planned for `spec` (in a thread: pure CPU work)."""
        mapped = to_chat_request(req)
        try:
            return self.core.plan_chat(mapped.chat, spec, scope)
        except APIError as exc:
            if exc.param == "thinking_budget_tokens":  # chat's name for what this request calls thinking.budget_tokens
                exc.message = exc.message.replace("`thinking_budget_tokens`", "`thinking.budget_tokens`")
                exc.param = "thinking.budget_tokens"
            raise

    async def plan(self, req: MessagesRequest, caller: Caller = ANONYMOUS) -> GenerationPlan:
        return await self.core.plan(req, self.target(req, caller), self.core.scope(caller, req.cache_salt), self.make_plan,
                                    caller)

    def reply(self, plan: GenerationPlan, stream: bool) -> MessagesReply:
        return MessagesReply(plan, stream)

    def events(self, plan: GenerationPlan, reply: MessagesReply) -> AsyncIterator[tuple[int, list[Event]]]:
        return self.core.events(plan, reply.reader)

    async def keep(self, req: MessagesRequest, reply: MessagesReply, caller: Caller) -> None:
        """A message keeps nothing."""

    async def complete(self, req: MessagesRequest, caller: Caller = ANONYMOUS) -> dict[str, Any]:
        return await self.lifecycle.complete(req, caller)

    def stream(self, req: MessagesRequest, caller: Caller = ANONYMOUS) -> AsyncIterator[list[dict[str, Any]]]:
        return self.lifecycle.stream(req, caller)
