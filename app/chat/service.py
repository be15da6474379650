"""ChatService: the ChatProcessor's work, orchestrated. A validated request is planned (off the
event loop, within a time budget), generated in rounds, parsed, and shaped as OpenAI responses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any, TypeVar

from ..api.errors import empty_reply, invalid_request, model_not_found
from ..api.schemas import ChatCompletionRequest
from ..config.settings import Limits, ModelSpec
from ..engine.events import Event, Finished, Started, Text, TokenLogprob
from ..observe.request_records import NullObserver, RequestObserver
from ..observe.tracing import traced
from ..prompt.tool_calling import resolve_reply_format
from ..serving.caller import ANONYMOUS, Caller, cache_scope
from .choices import ChoiceSplitter, merge
from .plan import GenerationPlan, plan_request
from .responses import ChunkMaker, chat_choice, completion_body
from .rounds import OpenStream, reply_events
from .tally import ReplyTally

T = TypeVar("T")


async def off_loop(limits: Limits, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` (prompt rendering, grammar building: CPU work) in a thread, within
    limits.grammar_timeout_s: past it, a 400 `request_too_complex`."""
    budget = limits.grammar_timeout_s
    try:
        return await asyncio.wait_for(asyncio.to_thread(fn, *args), budget)
    except asyncio.TimeoutError:
        raise invalid_request(f"Preparing this request (chat template, grammar) took longer than {budget:g} s "
                              f"(limits.grammar_timeout_s); simplify its tools, schema or grammar.",
                              code="request_too_complex") from None


class Choice:
    """One choice's reading of the reply: its parser, its tally, and its logprobs when asked for."""

    def __init__(self, plan: GenerationPlan) -> None:
        self.parser = plan.reply_parser()
        self.tally = ReplyTally()
        self.wants_logprobs = plan.gen.logprobs is not None
        self.logprobs: list[TokenLogprob] = []
        self._unsent = 0  # logprobs not yet attached to a chunk

    def add_logprobs(self, ev: Text) -> None:
        if self.wants_logprobs:
            self.logprobs.extend(ev.logprobs)

    def unsent_logprobs(self) -> list[TokenLogprob] | None:
        """Logprobs of tokens since the last chunk, for the next chunk (None: none to send)."""
        fresh = self.logprobs[self._unsent:]
        self._unsent = len(self.logprobs)
        return fresh or None


def usage(choices: list[Choice]) -> dict[str, Any]:
    """The prompt is counted once, however many choices share it."""
    out = choices[0].tally.usage()
    out["completion_tokens"] = sum(c.tally.completion_tokens for c in choices)
    out["total_tokens"] = out["prompt_tokens"] + out["completion_tokens"]
    return out


class ChatService:
    protocol = "chat"

    def __init__(self, specs: list[ModelSpec], open_stream: OpenStream, *, limits: Limits | None = None,
                 observer: RequestObserver | None = None, per_key_cache: bool = True) -> None:
        self.models = {s.id: s for s in specs}
        self.formats = {s.id: resolve_reply_format(s.chat_template, s.reasoning_parser, s.tool_parser)
                        for s in specs}
        self.open_stream = open_stream
        self.limits = limits or Limits()
        self.observer = observer or NullObserver()
        self.per_key_cache = per_key_cache

    async def plan(self, req: ChatCompletionRequest, caller: Caller = ANONYMOUS) -> GenerationPlan:
        """The request's plan, built off the event loop (template rendering and grammar building are
        CPU work) and within limits.grammar_timeout_s."""
        spec = self.models.get(req.model)
        if spec is None:
            raise model_not_found(req.model)
        work = off_loop(self.limits, plan_request, req, spec, self.formats[spec.id], self.limits)
        plan = await traced("plan", work, plan_attributes)
        plan.gen.cache_scope = cache_scope(caller, req.cache_salt, self.per_key_cache)
        plan.gen.cache_prompt = req.cache_prompt is not False
        return plan

    async def complete(self, req: ChatCompletionRequest, caller: Caller = ANONYMOUS) -> dict[str, Any]:
        plan = await self.plan(req, caller)
        choices = [Choice(plan) for _ in range(plan.gen.n)]
        failure: BaseException | None = None
        try:
            async for index, batch in self._events(plan, choices):
                for ev in batch:
                    if isinstance(ev, Text):
                        choices[index].add_logprobs(ev)
            _check_empty(plan, choices)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self._record(plan, choices, False, failure)
        bodies = []
        for index, choice in enumerate(choices):
            message = choice.parser.parse(choice.tally.text())
            finish = finish_reason(bool(message.get("tool_calls")), choice.tally.finish_reason)
            bodies.append(chat_choice(index, message, finish, choice.logprobs if choice.wants_logprobs else None))
        return completion_body(plan.gen.request_id, req.model, bodies, usage(choices))

    async def stream(self, req: ChatCompletionRequest, caller: Caller = ANONYMOUS) -> AsyncIterator[list[dict[str, Any]]]:
        """Chunk batches; the first is empty: "accepted", planning passed (its errors are the client's
        and come before it), so the Ingress can answer with headers while the model is awaited."""
        plan = await self.plan(req, caller)
        choices = [Choice(plan) for _ in range(plan.gen.n)]
        chunks = ChunkMaker(plan.gen.request_id, req.model, req.include_usage)
        failure: BaseException | None = None
        finished = 0  # choices
        try:
            yield []
            async for index, batch in self._events(plan, choices):
                choice = choices[index]
                out: list[dict[str, Any]] = []

                def emit(deltas: list[dict[str, Any]], choice: Choice = choice, index: int = index) -> None:
                    out.extend(chunks.delta(d, index=index, logprobs=choice.unsent_logprobs()) for d in deltas)

                for ev in batch:
                    if isinstance(ev, Started):
                        out.append(chunks.role(index))
                    elif isinstance(ev, Text):
                        choice.add_logprobs(ev)
                        emit(choice.parser.feed(ev.text))
                    elif isinstance(ev, Finished):
                        emit(choice.parser.finish())
                        finished += 1
                        if finished == len(choices):
                            # Refused: the error event replaces the final chunk (the SDK raises on it).
                            _check_empty(plan, choices)
                        finish = finish_reason(choice.parser.made_tool_calls, choice.tally.finish_reason)
                        out.append(chunks.delta({}, finish, index=index, logprobs=choice.unsent_logprobs()))
                if out:
                    yield out
            if req.include_usage:
                yield [chunks.usage(usage(choices))]
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self._record(plan, choices, True, failure)

    def _events(self, plan: GenerationPlan, choices: list[Choice]) -> AsyncIterator[tuple[int, list[Event]]]:
        """(choice index, its events) as the model makes them, each choice read in its own rounds."""
        timeout_s = self.limits.request_timeout_s
        if len(choices) == 1:
            return merge([reply_events(self.open_stream, plan, choices[0].parser, choices[0].tally, timeout_s)])
        split = ChoiceSplitter(self.open_stream(plan.spec.id, plan.gen), len(choices))
        return merge([reply_events(self.open_stream, plan, c.parser, c.tally, timeout_s, first=split.choice(i))
                      for i, c in enumerate(choices)])

    def _record(self, plan: GenerationPlan, choices: list[Choice], stream: bool, failure: BaseException | None) -> None:
        rec = choices[0].tally.record(plan.spec.id, stream, failure, self.protocol)
        if len(choices) > 1:
            rec = replace(rec, completion_tokens=sum(c.tally.completion_tokens for c in choices))
        self.observer.record(rec)


def plan_attributes(plan: GenerationPlan) -> dict[str, Any]:
    """What planning decided, for its span."""
    return {"llamaray.prompt_chars": len(plan.gen.prompt), "llamaray.grammar": plan.gen.sampling.grammar is not None,
            "llamaray.tools": len(plan.req.tools or []), "gen_ai.request.choice.count": plan.gen.n}


def finish_reason(made_calls: bool, ended: str | None) -> str | None:
    """`length` whenever the reply was cut, as OpenAI reports it: a call that streamed out before
    the cut keeps the arguments generated so far, so `tool_calls` would claim a whole call. Else
    `tool_calls` when the reply made calls."""
    return "tool_calls" if made_calls and ended != "length" else ended



def _check_empty(plan: GenerationPlan, choices: list[Choice]) -> None:
    """The finished reply, refused when every choice is empty and its model says `empty_reply: error`."""
    if plan.spec.empty_reply == "error" and all(c.tally.empty for c in choices):
        raise empty_reply()
