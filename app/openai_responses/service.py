"""The Responses API as an adapter of the generation core (app/generation/core.py): a request is mapped to the
chat request it means (after the stored conversation it continues), planned, generated and read by the core
as any chat-shaped turn, and what was read shaped as a `response` object or typed events. A response with
`store` (the default) is kept, owner-scoped, with the conversation a follow-up (`previous_response_id`)
continues."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..api.errors import APIError, invalid_request
from ..api.schemas import ChatCompletionRequest
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
from ..tokenize.service import prompt_count
from .events import ResponseEvents
from .mapping import Turn, responses_param, to_turn
from .schemas import ResponsesRequest
from .shaping import ResponseShaper
from .store import MemoryResponseStore, ResponseStore


def previous_not_found(response_id: str) -> APIError:
    return APIError(f"Previous response with id '{response_id}' not found.", status=404,
                    type="invalid_request_error", param="previous_response_id", code="not_found")


@dataclass(frozen=True)
class ResponsesPlan:
    chat: GenerationPlan
    turn: Turn


class ResponsesReply:
    """The core's reading of a reply shaped as a response: whole (`body`) or as typed events (`chunks`)."""

    def __init__(self, plan: ResponsesPlan, stream: bool) -> None:
        self.reader = ReplyReader(plan.chat)
        self.turn = plan.turn
        self.shaper = ResponseShaper(plan.turn.request)
        self.events = ResponseEvents(self.shaper, self.reader.usage) if stream else None
        self.response: dict[str, Any] | None = None  # the whole response, once it ended

    def read(self, batch: tuple[int, list[Event]]) -> None:
        self.reader.read(batch)

    def check(self) -> None:
        self.reader.check()

    def body(self) -> dict[str, Any]:
        result = self.reader.results()[0]  # a response is one choice
        self.response = self.shaper.finished_reply(result.message, result.finish_reason, self.reader.usage())
        return self.response

    def chunks(self, batch: tuple[int, list[Event]]) -> list[dict[str, Any]]:
        out = [event for ev in self.reader.feed(batch) for event in self.events.feed(ev)]
        self.response = self.events.final
        return out

    @property
    def whole(self) -> bool:
        return self.response is not None

    def tail(self) -> list[dict[str, Any]]:
        """Nothing: a response's usage is in its final event."""
        return []

    def record(self, protocol: str, stream: bool, failure: BaseException | None) -> RequestRecord:
        return self.reader.record(protocol, stream, failure)

    def entry(self) -> dict[str, Any]:
        """What the store keeps: the response, and the conversation a follow-up continues."""
        return {"response": self.response, "conversation": self.turn.conversation(self.response["output"])}


class ResponsesService:
    """`/v1/responses`: the core's turn as a response, kept in `response_store` when asked (`store`)."""

    protocol = "responses"

    def __init__(self, specs: list[ModelSpec], generate: Generate, *, limits: Limits | None = None,
                 observer: RequestObserver | None = None, per_key_cache: bool = True,
                 response_store: ResponseStore | None = None) -> None:
        self.core = GenerationCore(specs, generate, limits=limits, per_key_cache=per_key_cache)
        self.limits = self.core.limits
        self.store = response_store if response_store is not None else MemoryResponseStore()
        self.lifecycle: Lifecycle[ResponsesRequest, ResponsesPlan, ResponsesReply] = Lifecycle(self, observer)

    def target(self, req: ResponsesRequest | ChatCompletionRequest, caller: Caller) -> Target:
        return self.core.target(req.model, "/v1/responses", caller)

    async def turn(self, req: ResponsesRequest, caller: Caller) -> Turn:
        """The request's conversation: after the stored one it continues, if any (another key's is unknown)."""
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            entry = await self.store.get(caller.key_id, req.previous_response_id)
            if entry is None:
                raise previous_not_found(req.previous_response_id)
            history = entry["conversation"]
        turn = to_turn(req, history)
        if len(turn.chat.messages) > self.limits.max_messages:
            raise invalid_request(f"Too many messages: {len(turn.chat.messages)} with the conversation this "
                                  f"request continues (at most {self.limits.max_messages}).", param="input",
                                  code="too_many_messages")
        return turn

    def make_plan(self, req: ChatCompletionRequest, spec: ModelSpec, scope: str) -> GenerationPlan:
        """The turn's chat request planned for `spec` (in a thread: pure CPU work)."""
        return self.core.plan_chat(req, spec, scope)

    async def plan(self, req: ResponsesRequest, caller: Caller = ANONYMOUS) -> ResponsesPlan:
        turn = await self.turn(req, caller)
        try:
            chat = await self.core.plan(turn.chat, self.target(turn.chat, caller), self.core.scope(caller, turn.chat.cache_salt),
                                        self.make_plan, caller)
        except APIError as exc:
            raise responses_param(exc) from None
        return ResponsesPlan(chat, turn)

    def reply(self, plan: ResponsesPlan, stream: bool) -> ResponsesReply:
        return ResponsesReply(plan, stream)

    def events(self, plan: ResponsesPlan, reply: ResponsesReply) -> AsyncIterator[tuple[int, list[Event]]]:
        return self.core.events(plan.chat, reply.reader)

    async def keep(self, req: ResponsesRequest, reply: ResponsesReply, caller: Caller) -> None:
        """Kept before the client has the response (a stream's final event), so a follow-up sent on it finds it."""
        if req.store is not False:
            await self.store.put(caller.key_id, reply.response["id"], reply.entry())

    async def complete(self, req: ResponsesRequest, caller: Caller = ANONYMOUS) -> dict[str, Any]:
        return await self.lifecycle.complete(req, caller)

    def stream(self, req: ResponsesRequest, caller: Caller = ANONYMOUS) -> AsyncIterator[list[dict[str, Any]]]:
        return self.lifecycle.stream(req, caller)


class InputTokensService:
    """`POST /v1/responses/input_tokens`: the prompt the same request would generate from, rendered by the
    chat planning and counted by the model's tokenizer (its `usage.input_tokens`)."""

    protocol = "responses"

    def __init__(self, responses: ResponsesService, tokens: Any) -> None:
        self.responses = responses
        self.tokens = tokens  # app.tokenize.service.ModelTokens

    async def complete(self, req: ResponsesRequest, caller: Caller = ANONYMOUS) -> dict[str, Any]:
        plan = await self.responses.plan(req, caller)
        count = await prompt_count(self.tokens, plan.chat.spec.id, plan.chat.gen.prompt, plan.chat.gen.images)
        return {"object": "response.input_tokens", "input_tokens": count}

    def stream(self, req: ResponsesRequest, caller: Caller = ANONYMOUS) -> AsyncIterator[list[dict[str, Any]]]:
        raise invalid_request("`stream` is not supported when counting input tokens.", param="stream")
