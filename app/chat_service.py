"""The ChatProcessor's work: messages -> prompt -> engine stream -> OpenAI response or chunks.

`open_stream(model_id, generation_request_dict)` is how the service reaches a model: a Ray
handle in production, an in-process engine or a fake in tests. It yields lists of engine events
(see engine/stream.py) and raises APIError for failures.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

from .chat_template import render_prompt
from .config import Limits, ModelSpec
from .engine.params import GenerationRequest, SamplingParams
from .errors import APIError, invalid_request, model_not_found, timeout_error
from .gbnf_check import GBNFLimits, check_gbnf
from .grammars import GrammarLimits, json_grammar
from .observe import NullObserver, RequestObserver, RequestRecord
from .parsers import ReplyParser
from .reply import make_reply_parser
from .schemas import ChatCompletionRequest
from .tool_calling import ReplyFormat, plan_tools, resolve_reply_format

# Tokens kept free when a cut tool call is continued: the prompt plus the reply so far is tokenized
# anew, and the reply's text may not give back exactly the tokens that produced it.
CONTINUATION_MARGIN = 16

OpenStream = Callable[[str, dict[str, Any]], AsyncIterator[list[dict[str, Any]]]]


def sampling_from(req: ChatCompletionRequest, n_vocab: int = 0) -> SamplingParams:
    p = SamplingParams()
    for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                 "repeat_penalty", "seed"):
        value = getattr(req, name)
        if value is not None:
            setattr(p, name, value)
    for key, bias in (req.logit_bias or {}).items():
        if n_vocab and int(key) >= n_vocab:
            raise invalid_request(f"`logit_bias` names token {key}, which is not a token id of model "
                                  f"`{req.model}` (its vocabulary has {n_vocab} tokens).", param="logit_bias",
                                  code="invalid_logit_bias")
        p.logit_bias.append((int(key), float(bias)))
    return p


def grammar_limits(limits: Limits) -> GrammarLimits:
    return GrammarLimits(max_repetition=limits.max_schema_repetition, max_depth=limits.max_schema_depth,
                         max_grammar_bytes=limits.max_schema_grammar_bytes)


def format_grammar(req: ChatCompletionRequest, limits: GrammarLimits = GrammarLimits()) -> str | None:
    """The grammar `response_format` or the llama.cpp-style `grammar` field asks for."""
    fmt = req.response_format
    wants_json = fmt is not None and fmt.type != "text"
    if wants_json and req.grammar:
        raise invalid_request("Use either `response_format` or `grammar`, not both.", param="grammar")
    if req.grammar:
        return req.grammar
    if not wants_json:
        return None
    if fmt.type == "json_object":
        return json_grammar({"type": "object"}, "response_format", limits)
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise invalid_request("`response_format.json_schema.schema` is required for type `json_schema`.",
                              param="response_format.json_schema")
    return json_grammar(fmt.json_schema.schema_, "response_format.json_schema.schema", limits)


def split_call_deltas(deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI's call shape: a call's first delta has index, id, type, name and empty arguments;
    the arguments follow in deltas that carry only `index` and `function.arguments`."""
    out: list[dict[str, Any]] = []
    for delta in deltas:
        calls = delta.get("tool_calls")
        if not calls:
            out.append(delta)
            continue
        for call in calls:
            args = call["function"].get("arguments", "")
            if "id" in call:
                out.append({"tool_calls": [{**call, "function": {**call["function"], "arguments": ""}}]})
                if args:
                    out.append({"tool_calls": [{"index": call["index"], "function": {"arguments": args}}]})
            else:
                out.append({"tool_calls": [call]})
    return out


class _Reply:
    """Accumulates one request's engine events (over continuation rounds too)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.first_text_at: float | None = None
        self.last_text_at: float | None = None
        self.text: list[str] = []
        self.started = False
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.finish_reason: str | None = None

    def full_text(self) -> str:
        return "".join(self.text)

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def add_text(self, text: str) -> None:
        now = time.monotonic()
        if self.first_text_at is None:
            self.first_text_at = now
        self.last_text_at = now
        self.text.append(text)

    def record(self, model: str, stream: bool, exc: BaseException | None) -> RequestRecord:
        status, code = "ok", None
        if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
            status = "cancelled"
        elif exc is not None:
            api = exc if isinstance(exc, APIError) else None
            code = api.code if api else "internal_error"
            status = "timeout" if code == "timeout" else "error"
        ttft = self.first_text_at - self.t0 if self.first_text_at is not None else None
        itl = None
        if self.first_text_at is not None and self.completion_tokens > 1:
            itl = (self.last_text_at - self.first_text_at) / (self.completion_tokens - 1)
        return RequestRecord(model=model, stream=stream, status=status, error_code=code,
                             duration_s=time.monotonic() - self.t0, ttft_s=ttft, itl_s=itl,
                             prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                             cached_tokens=self.cached_tokens)

    def start(self, ev: dict[str, Any]) -> None:
        self.started = True
        self.prompt_tokens = ev["prompt_tokens"]
        self.cached_tokens = ev["cached_tokens"]


@dataclass
class _Plan:
    req: ChatCompletionRequest
    spec: ModelSpec
    gen: GenerationRequest
    tool_parser: str | None
    fmt: ReplyFormat

    def parser(self) -> ReplyParser:
        return make_reply_parser(self.fmt, self.req, self.tool_parser)


def check_limits(req: ChatCompletionRequest, spec: ModelSpec) -> None:
    """Content this text-only server cannot take, and completion limits: a 400 that names the
    limit (as OpenAI answers), never a silent clamp."""
    for i, msg in enumerate(req.messages):
        if isinstance(msg.content, list):
            for j, part in enumerate(msg.content):
                if part.type not in ("text", "refusal"):
                    raise invalid_request(f"Model `{spec.id}` takes text only; `{part.type}` content is not supported.",
                                          param=f"messages[{i}].content[{j}].type", code="unsupported_content")
    limit = spec.max_tokens_limit or spec.n_ctx
    asked = req.completion_limit
    if asked is not None and asked > limit:
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        raise invalid_request(f"`{param}` is too large: {asked}. This model supports at most {limit} completion tokens.",
                              param=param, code="max_tokens_exceeded")


def check_grammar_inputs(req: ChatCompletionRequest, limits: Limits) -> None:
    """Sizes of what becomes a grammar (`grammar`, `tools`), before any grammar work starts."""
    if req.grammar is not None:
        check_gbnf(req.grammar, GBNFLimits(max_bytes=limits.max_grammar_bytes, max_depth=limits.max_grammar_depth,
                                           max_repetition=limits.max_schema_repetition))
    if req.tools:
        if len(req.tools) > limits.max_tools:
            raise invalid_request(f"Too many tools: {len(req.tools)} (at most {limits.max_tools}, limits.max_tools).",
                                  param="tools", code="too_many_tools")
        size = len(json.dumps([t.model_dump(exclude_none=True) for t in req.tools]))
        if size > limits.max_tools_bytes:
            raise invalid_request(f"`tools` is {size} bytes as JSON; at most {limits.max_tools_bytes} are accepted "
                                  f"(limits.max_tools_bytes).", param="tools", code="tools_too_large")


async def with_deadline(events: AsyncIterator[Any], deadline: float, timeout_s: float) -> AsyncIterator[Any]:
    """Iterate `events` until `deadline` (monotonic); then stop it and raise a 504 APIError.
    Closing the source cancels the generation, so a stuck request frees its slot."""
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise timeout_error(timeout_s)
            try:
                item = await asyncio.wait_for(anext(events), remaining)
            except StopAsyncIteration:
                return
            except asyncio.TimeoutError:
                raise timeout_error(timeout_s) from None
            yield item
    finally:
        await events.aclose()


class ChatService:
    def __init__(self, specs: list[ModelSpec], open_stream: OpenStream, *, limits: Limits | None = None,
                 observer: RequestObserver | None = None) -> None:
        self.limits = limits or Limits()
        request_timeout_s = self.limits.request_timeout_s
        self.observer = observer or NullObserver()
        self.models = {s.id: s for s in specs}
        self.formats = {s.id: resolve_reply_format(s.chat_template, s.reasoning_parser, s.tool_parser)
                        for s in specs}
        self.open_stream = open_stream
        self.request_timeout_s = request_timeout_s

    def _prepare(self, payload: dict[str, Any]) -> _Plan:
        req = ChatCompletionRequest.model_validate(payload)
        spec = self.models.get(req.model)
        if spec is None:
            raise model_not_found(req.model)
        check_limits(req, spec)
        check_grammar_inputs(req, self.limits)
        fmt = self.formats[spec.id]
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        schema_limits = grammar_limits(self.limits)
        tools = plan_tools(fmt, req, messages, schema_limits)
        grammar = format_grammar(req, schema_limits)
        if tools.grammar:
            grammar = tools.grammar  # a forced call wins over a free-form format
        prompt = render_prompt(
            spec.chat_template,
            tools.messages,
            tools=tools.template_tools,
            bos_token=spec.bos_token,
            eos_token=spec.eos_token,
            mark_content=True,
        )
        sampling = sampling_from(req, spec.n_vocab)
        sampling.grammar = grammar
        gen = GenerationRequest(
            request_id=uuid.uuid4().hex,
            prompt=prompt,
            max_tokens=req.completion_limit,
            stop=req.stop_list,
            sampling=sampling,
        )
        return _Plan(req, spec, gen, tools.parser, fmt)

    async def _generate(self, plan: _Plan, parser: ReplyParser, reply: _Reply) -> AsyncIterator[list[dict[str, Any]]]:
        """Engine events for the request, recorded in `reply`. A reply that `max_tokens` cut
        inside a tool call's JSON is continued (bounded rounds) so the client gets a whole call;
        the continuation's start/end events are folded into the one reply."""
        gen = plan.gen
        rounds = 0
        deadline = time.monotonic() + self.request_timeout_s
        while True:
            continued = False
            events = with_deadline(self.open_stream(plan.spec.id, gen.to_dict()), deadline, self.request_timeout_s)
            async for batch in events:
                out = []
                for ev in batch:
                    kind = ev["type"]
                    if kind == "start":
                        if reply.started:
                            continue
                        reply.start(ev)
                    elif kind == "text":
                        reply.add_text(ev["text"])
                    elif kind == "end":
                        reply.completion_tokens += ev["completion_tokens"]
                        if (ev["finish_reason"] == "length" and plan.tool_parser
                                and rounds < plan.spec.tool_continuation_rounds
                                and self._continuation_room(plan, reply) > 0
                                and parser.has_open_call(reply.full_text())):
                            continued = True
                            continue
                        reply.finish_reason = ev["finish_reason"]
                    out.append(ev)
                if out:
                    yield out
            if not continued:
                if reply.finish_reason is None:
                    raise APIError("The model stream ended without finishing.", status=502, type="server_error",
                                   code="incomplete_generation")
                return
            rounds += 1
            # Continue from prompt + everything generated; the slot's KV prefix is reused.
            gen = GenerationRequest(
                request_id=uuid.uuid4().hex,
                prompt=plan.gen.prompt + reply.full_text(),
                max_tokens=self._continuation_room(plan, reply),
                stop=plan.gen.stop,
                # keep a forced call's grammar, resumed after the text it already produced
                sampling=replace(plan.gen.sampling, grammar_prefix=reply.full_text()),
            )

    @staticmethod
    def _continuation_room(plan: _Plan, reply: _Reply) -> int:
        """Tokens a continuation round may generate: its budget, within what is left of the context
        (a margin covers re-tokenizing the reply). 0: no room, the reply ends with `length`."""
        left = plan.spec.n_ctx - reply.prompt_tokens - reply.completion_tokens - CONTINUATION_MARGIN
        return max(0, min(plan.spec.tool_continuation_tokens, left))

    async def _plan(self, payload: dict[str, Any]) -> _Plan:
        """The request's plan, built off the event loop (template rendering and grammar building are
        CPU work) and within limits.grammar_timeout_s."""
        budget = self.limits.grammar_timeout_s
        try:
            return await asyncio.wait_for(asyncio.to_thread(self._prepare, payload), budget)
        except asyncio.TimeoutError:
            raise invalid_request(f"Preparing this request (chat template, grammar) took longer than {budget:g} s "
                                  f"(limits.grammar_timeout_s); simplify its tools, schema or grammar.",
                                  code="request_too_complex") from None

    async def complete(self, payload: dict[str, Any]) -> dict[str, Any]:
        plan = await self._plan(payload)
        parser = plan.parser()
        reply = _Reply()
        failure: BaseException | None = None
        try:
            async for _ in self._generate(plan, parser, reply):
                pass
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self.observer.record(reply.record(plan.spec.id, False, failure))
        message = parser.parse(reply.full_text())
        finish = "tool_calls" if message.get("tool_calls") else reply.finish_reason
        return {
            "id": f"chatcmpl-{plan.gen.request_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": plan.req.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": message.get("content"), "refusal": None,
                            **{k: v for k, v in message.items() if k != "content" and v is not None}},
                "logprobs": None,
                "finish_reason": finish,
            }],
            "usage": reply.usage(),
        }

    async def stream(self, payload: dict[str, Any]) -> AsyncIterator[list[dict[str, Any]]]:
        plan = await self._plan(payload)
        parser = plan.parser()
        reply = _Reply()
        include_usage = plan.req.include_usage
        base = {"id": f"chatcmpl-{plan.gen.request_id}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": plan.req.model}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            c = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            if include_usage:
                c["usage"] = None
            return c

        failure: BaseException | None = None
        try:
            async for batch in self._generate(plan, parser, reply):
                out: list[dict[str, Any]] = []
                for ev in batch:
                    if ev["type"] == "start":
                        out.append(chunk({"role": "assistant", "content": ""}))
                    elif ev["type"] == "text":
                        out.extend(chunk(d) for d in split_call_deltas(parser.feed(ev["text"])))
                    elif ev["type"] == "end":
                        out.extend(chunk(d) for d in split_call_deltas(parser.finish()))
                        finish = "tool_calls" if parser.made_tool_calls else reply.finish_reason
                        out.append(chunk({}, finish))
                        if include_usage:
                            out.append({**base, "choices": [], "usage": reply.usage()})
                if out:
                    yield out
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self.observer.record(reply.record(plan.spec.id, True, failure))
