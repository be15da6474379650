"""ChatService: chat completions as an adapter of the generation core (app/generation/core.py). The core plans
the request, generates its choices in rounds and reads the reply; this shapes what it read as OpenAI's
`chat.completion` or its chunks. The lifecycle around it (app/generation/lifecycle.py) is every generating
protocol's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ..api.schemas import ChatCompletionRequest
from ..config.app_args import Limits
from ..config.spec import ModelSpec
from ..engine.events import Event
from ..generation.adapters import Target
from ..generation.caller import ANONYMOUS, Caller
from ..generation.core import GenerationCore
from ..generation.lifecycle import Lifecycle
from ..generation.plan import GenerationPlan
from ..generation.reading import Delta, Opened, ReplyEvent, ReplyReader
from ..generation.rounds import Generate
from ..observe.request_records import RequestObserver, RequestRecord
from .responses import ChunkMaker, chat_choice, completion_body


class ChatReply:
    """A chat reply: the core's reading of it shaped as a `chat.completion`, or for a stream as its chunks.
    Batches: (choice index, that choice's events)."""

    def __init__(self, plan: GenerationPlan, stream: bool) -> None:
        self.plan = plan
        self.reader = ReplyReader(plan)
        self.maker = ChunkMaker(plan.gen.request_id, plan.req.model, plan.req.include_usage) if stream else None

    def read(self, batch: tuple[int, list[Event]]) -> None:
        self.reader.read(batch)

    def check(self) -> None:
        self.reader.check()

    def body(self) -> dict[str, Any]:
        choices = [chat_choice(index, r.message, r.finish_reason, r.logprobs)
                   for index, r in enumerate(self.reader.results())]
        return completion_body(self.plan.gen.request_id, self.plan.req.model, choices, self.reader.usage())

    def chunks(self, batch: tuple[int, list[Event]]) -> list[dict[str, Any]]:
        return [self._chunk(ev) for ev in self.reader.feed(batch)]

    def _chunk(self, ev: ReplyEvent) -> dict[str, Any]:
        maker = self.maker
        if isinstance(ev, Opened):
            return maker.role(ev.index)
        if isinstance(ev, Delta):
            return maker.delta(ev.delta, index=ev.index, logprobs=ev.logprobs)
        return maker.delta({}, ev.finish_reason, index=ev.index, logprobs=ev.logprobs)

    @property
    def whole(self) -> bool:
        return self.reader.ended

    def tail(self) -> list[dict[str, Any]]:
        """The usage chunk, when the client asked for it (`stream_options.include_usage`)."""
        return [self.maker.usage(self.reader.usage())] if self.plan.req.include_usage else []

    def record(self, protocol: str, stream: bool, failure: BaseException | None) -> RequestRecord:
        return self.reader.record(protocol, stream, failure)


class ChatService:
    """`/v1/chat/completions`: the core's turn as OpenAI's chat completion."""

    protocol = "chat"

    def __init__(self, specs: list[ModelSpec], generate: Generate, *, limits: Limits | None = None,
                 observer: RequestObserver | None = None, per_key_cache: bool = True) -> None:
        self.core = GenerationCore(specs, generate, limits=limits, per_key_cache=per_key_cache)
        self.lifecycle: Lifecycle[ChatCompletionRequest, GenerationPlan, ChatReply] = Lifecycle(self, observer)

    def target(self, req: ChatCompletionRequest, caller: Caller) -> Target:
        return self.core.target(req.model, "/v1/chat/completions", caller, req.lora)

    def make_plan(self, req: ChatCompletionRequest, spec: ModelSpec, scope: str) -> GenerationPlan:
        """The request's plan for `spec` (in a thread: pure CPU work)."""
        return self.core.plan_chat(req, spec, scope)

    async def plan(self, req: ChatCompletionRequest, caller: Caller = ANONYMOUS) -> GenerationPlan:
        return await self.core.plan(req, self.target(req, caller), self.core.scope(caller, req.cache_salt), self.make_plan,
                                    caller)

    def reply(self, plan: GenerationPlan, stream: bool) -> ChatReply:
        return ChatReply(plan, stream)

    def events(self, plan: GenerationPlan, reply: ChatReply) -> AsyncIterator[tuple[int, list[Event]]]:
        return self.core.events(plan, reply.reader)

    async def keep(self, req: ChatCompletionRequest, reply: ChatReply, caller: Caller) -> None:
        """A chat completion keeps nothing."""

    async def complete(self, req: ChatCompletionRequest, caller: Caller = ANONYMOUS) -> dict[str, Any]:
        return await self.lifecycle.complete(req, caller)

    def stream(self, req: ChatCompletionRequest, caller: Caller = ANONYMOUS) -> AsyncIterator[list[dict[str, Any]]]:
        return self.lifecycle.stream(req, caller)
