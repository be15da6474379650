"""The Responses API over the chat service: a request is mapped to its chat request (after the stored
conversation it continues), planned, generated and parsed exactly as a chat completion, and its reply shaped
as a `response` object or typed events. A response with `store` (the default) is kept, owner-scoped, with
the conversation a follow-up (`previous_response_id`) continues."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..api.errors import APIError, invalid_request
from ..generation.plan import GenerationPlan
from ..chat.service import ChatReply, ChatService
from ..chat.service import usage as chat_usage
from ..engine.events import Event
from ..observe.request_records import RequestRecord
from ..tokenize.service import prompt_count
from ..generation.caller import ANONYMOUS, Caller
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
    """A chat reply shaped as a response: whole (`body`) or as typed events (`chunks`)."""

    def __init__(self, plan: ResponsesPlan, stream: bool) -> None:
        self.chat = ChatReply(plan.chat, stream)
        self.turn = plan.turn
        self.shaper = ResponseShaper(plan.turn.request)
        self.events = ResponseEvents(self.shaper, lambda: chat_usage(self.chat.choices)) if stream else None
        self.response: dict[str, Any] | None = None  # the whole response, once it ended

    def read(self, batch: tuple[int, list[Event]]) -> None:
        self.chat.read(batch)

    def check(self) -> None:
        self.chat.check()

    def body(self) -> dict[str, Any]:
        self.response = self.shaper.from_chat(self.chat.body())
        return self.response

    def chunks(self, batch: tuple[int, list[Event]]) -> list[dict[str, Any]]:
        out = [event for chunk in self.chat.chunks(batch) for event in self.events.feed(chunk)]
        self.response = self.events.final
        return out

    def usage_chunk(self) -> dict[str, Any]:
        raise NotImplementedError("a response's usage is in its final event")

    def record(self, protocol: str, stream: bool, failure: BaseException | None) -> RequestRecord:
        return self.chat.record(protocol, stream, failure)

    def entry(self) -> dict[str, Any]:
        """What the store keeps: the response, and the conversation a follow-up continues."""
        return {"response": self.response, "conversation": self.turn.conversation(self.response["output"])}


class ResponsesService(ChatService):
    protocol = "responses"

    def __init__(self, *args: Any, response_store: ResponseStore | None = None, **options: Any) -> None:
        super().__init__(*args, **options)
        self.store = response_store if response_store is not None else MemoryResponseStore()

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

    async def plan(self, req: ResponsesRequest, caller: Caller = ANONYMOUS) -> ResponsesPlan:  # type: ignore[override]
        turn = await self.turn(req, caller)
        try:
            chat = await super().plan(turn.chat, caller)
        except APIError as exc:
            raise responses_param(exc) from None
        return ResponsesPlan(chat, turn)

    def reply(self, plan: ResponsesPlan, stream: bool) -> ResponsesReply:  # type: ignore[override]
        return ResponsesReply(plan, stream)

    def events(self, plan: ResponsesPlan, reply: ResponsesReply) -> AsyncIterator[tuple[int, list[Event]]]:  # type: ignore[override]
        return super().events(plan.chat, reply.chat)

    def is_whole(self, reply: ResponsesReply) -> bool:  # type: ignore[override]
        return reply.response is not None

    async def whole(self, req: ResponsesRequest, reply: ResponsesReply, caller: Caller) -> None:  # type: ignore[override]
        """Kept before the client has the response (a stream's final event), so a follow-up sent on it finds it."""
        if req.store is not False:
            await self.store.put(caller.key_id, reply.response["id"], reply.entry())


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
