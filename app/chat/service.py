"""ChatService: the ChatProcessor's work, orchestrated. A validated request is planned (off the
event loop, within a time budget), generated in rounds, parsed, and shaped as OpenAI responses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from ..config import Limits, ModelSpec
from ..engine.events import Finished, Started, Text
from ..errors import empty_reply, invalid_request, model_not_found
from ..observe import NullObserver, RequestObserver
from ..schemas import ChatCompletionRequest
from ..tool_calling import resolve_reply_format
from .plan import GenerationPlan, plan_request
from .responses import ChunkMaker, completion_body
from .rounds import OpenStream, reply_events
from .tally import ReplyTally


class ChatService:
    def __init__(self, specs: list[ModelSpec], open_stream: OpenStream, *, limits: Limits | None = None,
                 observer: RequestObserver | None = None) -> None:
        self.models = {s.id: s for s in specs}
        self.formats = {s.id: resolve_reply_format(s.chat_template, s.reasoning_parser, s.tool_parser)
                        for s in specs}
        self.open_stream = open_stream
        self.limits = limits or Limits()
        self.observer = observer or NullObserver()

    async def plan(self, req: ChatCompletionRequest) -> GenerationPlan:
        """The request's plan, built off the event loop (template rendering and grammar building are
        CPU work) and within limits.grammar_timeout_s."""
        spec = self.models.get(req.model)
        if spec is None:
            raise model_not_found(req.model)
        budget = self.limits.grammar_timeout_s
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(plan_request, req, spec, self.formats[spec.id], self.limits), budget)
        except asyncio.TimeoutError:
            raise invalid_request(f"Preparing this request (chat template, grammar) took longer than {budget:g} s "
                                  f"(limits.grammar_timeout_s); simplify its tools, schema or grammar.",
                                  code="request_too_complex") from None

    async def complete(self, req: ChatCompletionRequest) -> dict[str, Any]:
        plan = await self.plan(req)
        parser, tally = plan.reply_parser(), ReplyTally()
        failure: BaseException | None = None
        try:
            async for _ in reply_events(self.open_stream, plan, parser, tally, self.limits.request_timeout_s):
                pass
            _check_empty(plan, tally)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self.observer.record(tally.record(plan.spec.id, False, failure))
        message = parser.parse(tally.text())
        finish = "tool_calls" if message.get("tool_calls") else tally.finish_reason
        return completion_body(plan.gen.request_id, req.model, message, finish, tally.usage())

    async def stream(self, req: ChatCompletionRequest) -> AsyncIterator[list[dict[str, Any]]]:
        """Chunk batches; the first is empty: "accepted", planning passed (its errors are the client's
        and come before it), so the Ingress can answer with headers while the model is awaited."""
        plan = await self.plan(req)
        parser, tally = plan.reply_parser(), ReplyTally()
        chunks = ChunkMaker(plan.gen.request_id, req.model, req.include_usage)
        failure: BaseException | None = None
        try:
            yield []
            async for batch in reply_events(self.open_stream, plan, parser, tally, self.limits.request_timeout_s):
                out: list[dict[str, Any]] = []
                for ev in batch:
                    if isinstance(ev, Started):
                        out.append(chunks.role())
                    elif isinstance(ev, Text):
                        out.extend(chunks.delta(d) for d in parser.feed(ev.text))
                    elif isinstance(ev, Finished):
                        # Refused: the error event replaces the final chunk (the SDK raises on it).
                        _check_empty(plan, tally)
                        out.extend(chunks.delta(d) for d in parser.finish())
                        out.append(chunks.delta({}, "tool_calls" if parser.made_tool_calls else tally.finish_reason))
                        if req.include_usage:
                            out.append(chunks.usage(tally.usage()))
                if out:
                    yield out
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self.observer.record(tally.record(plan.spec.id, True, failure))


def _check_empty(plan: GenerationPlan, tally: ReplyTally) -> None:
    """The finished reply, refused when it is empty and its model says `empty_reply: error`."""
    if plan.spec.empty_reply == "error" and tally.empty:
        raise empty_reply()
