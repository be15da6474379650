"""ChatService: the ChatProcessor's work, orchestrated. A validated request is planned (off the
event loop, within a time budget), generated in rounds, parsed, and shaped as OpenAI responses; the
lifecycle around it (app/generation/lifecycle.py) is the one CompletionService shares."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from ..api.errors import empty_reply
from ..api.schemas import ChatCompletionRequest
from ..config.settings import ModelSpec
from ..engine.events import Event, Finished, Started, Text, TokenLogprob
from ..observe.request_records import RequestRecord
from ..prompt.tool_calling import resolve_reply_format
from ..generation.caller import ANONYMOUS, Caller
from ..generation.lifecycle import RequestLifecycle
from .choices import ChoiceSplitter, merge
from ..generation.images import load_images
from ..generation.plan import GenerationPlan, plan_request
from .responses import ChunkMaker, chat_choice, completion_body
from .rounds import reply_events
from .tally import ReplyTally


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


class ChatReply:
    """A chat reply: its choices, each read by its own parser, and for a stream the chunks they make.
    Batches: (choice index, that choice's events)."""

    def __init__(self, plan: GenerationPlan, stream: bool) -> None:
        self.plan = plan
        self.choices = [Choice(plan) for _ in range(plan.gen.n)]
        self.maker = ChunkMaker(plan.gen.request_id, plan.req.model, plan.req.include_usage) if stream else None
        self.finished = 0  # choices, in a stream

    def read(self, batch: tuple[int, list[Event]]) -> None:
        index, events = batch
        for ev in events:
            if isinstance(ev, Text):
                self.choices[index].add_logprobs(ev)

    def check(self) -> None:
        """Refused when every choice is empty and its model says `empty_reply: error`."""
        if self.plan.spec.empty_reply == "error" and all(c.tally.empty for c in self.choices):
            raise empty_reply()

    def body(self) -> dict[str, Any]:
        bodies = []
        for index, choice in enumerate(self.choices):
            message = choice.parser.parse(choice.tally.text())
            finish = finish_reason(bool(message.get("tool_calls")), choice.tally.finish_reason)
            bodies.append(chat_choice(index, message, finish, choice.logprobs if choice.wants_logprobs else None))
        return completion_body(self.plan.gen.request_id, self.plan.req.model, bodies, usage(self.choices))

    def chunks(self, batch: tuple[int, list[Event]]) -> list[dict[str, Any]]:
        index, events = batch
        choice, maker = self.choices[index], self.maker
        out: list[dict[str, Any]] = []

        def emit(deltas: list[dict[str, Any]]) -> None:
            out.extend(maker.delta(d, index=index, logprobs=choice.unsent_logprobs()) for d in deltas)

        for ev in events:
            if isinstance(ev, Started):
                out.append(maker.role(index))
            elif isinstance(ev, Text):
                choice.add_logprobs(ev)
                emit(choice.parser.feed(ev.text))
            elif isinstance(ev, Finished):
                emit(choice.parser.finish())
                self.finished += 1
                if self.finished == len(self.choices):
                    self.check()  # refused: the error event replaces the final chunk (the SDK raises on it)
                finish = finish_reason(choice.parser.made_tool_calls, choice.tally.finish_reason)
                out.append(maker.delta({}, finish, index=index, logprobs=choice.unsent_logprobs()))
        return out

    def usage_chunk(self) -> dict[str, Any]:
        return self.maker.usage(usage(self.choices))

    def record(self, protocol: str, stream: bool, failure: BaseException | None) -> RequestRecord:
        rec = self.choices[0].tally.record(self.plan.spec.id, stream, failure, protocol)
        if len(self.choices) > 1:
            rec = replace(rec, completion_tokens=sum(c.tally.completion_tokens for c in self.choices))
        return rec


class ChatService(RequestLifecycle[ChatCompletionRequest, GenerationPlan, ChatReply]):
    protocol = "chat"

    def __init__(self, specs: list[ModelSpec], *args: Any, **options: Any) -> None:
        super().__init__(specs, *args, **options)
        self.formats = {s.id: resolve_reply_format(s.chat_template, s.reasoning_parser, s.tool_parser)
                        for s in specs}

    def make_plan(self, req: ChatCompletionRequest, spec: ModelSpec, scope: str) -> GenerationPlan:
        return self.plan_chat(req, spec, scope)

    async def plan(self, req: ChatCompletionRequest, caller: Caller = ANONYMOUS) -> GenerationPlan:
        """The plan, then its images loaded (planning checked them): decoded here, so the model's replica
        receives pixels and never fetches or parses anything."""
        plan = await super().plan(req, caller)
        plan.gen.images = await load_images(plan.req, self.limits)
        return plan

    def plan_chat(self, req: ChatCompletionRequest, spec: ModelSpec, scope: str,
                  template_kwargs: dict[str, Any] | None = None) -> GenerationPlan:
        """A chat request's plan (a protocol mapped onto chat plans through here too)."""
        plan = plan_request(req, spec, self.formats[spec.id], self.limits, template_kwargs)
        plan.gen.cache_scope = scope
        plan.gen.cache_prompt = req.cache_prompt is not False
        return plan

    def use_adapters(self, plan: GenerationPlan, adapters: tuple[tuple[str, float], ...]) -> None:
        plan.gen.adapters = adapters  # a continuation round copies plan.gen, adapters included

    def plan_attributes(self, plan: GenerationPlan) -> dict[str, Any]:
        return {"llamaray.prompt_chars": len(plan.gen.prompt), "llamaray.grammar": plan.gen.sampling.grammar is not None,
                "llamaray.tools": len(plan.req.tools or []), "gen_ai.request.choice.count": plan.gen.n}

    def reply(self, plan: GenerationPlan, stream: bool) -> ChatReply:
        return ChatReply(plan, stream)

    def events(self, plan: GenerationPlan, reply: ChatReply) -> AsyncIterator[tuple[int, list[Event]]]:
        """(choice index, its events) as the model makes them, each choice read in its own rounds."""
        timeout_s, choices = self.limits.request_timeout_s, reply.choices
        if len(choices) == 1:
            return merge([reply_events(self.open_stream, plan, choices[0].parser, choices[0].tally, timeout_s)])
        split = ChoiceSplitter(self.open_stream(plan.spec.id, plan.gen), len(choices))
        return merge([reply_events(self.open_stream, plan, c.parser, c.tally, timeout_s, first=split.choice(i))
                      for i, c in enumerate(choices)])


def finish_reason(made_calls: bool, ended: str | None) -> str | None:
    """`length` whenever the reply was cut, as OpenAI reports it: a call that streamed out before
    the cut keeps the arguments generated so far, so `tool_calls` would claim a whole call. Else
    `tool_calls` when the reply made calls."""
    return "tool_calls" if made_calls and ended != "length" else ended

