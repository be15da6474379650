"""The ChatProcessor's work: messages -> prompt -> engine stream -> OpenAI response or chunks.

`open_stream(model_id, generation_request_dict)` is how the service reaches a model: a Ray
handle in production, an in-process engine or a fake in tests. It yields lists of engine events
(see engine/stream.py) and raises APIError for failures.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from .chat_template import render_prompt
from .config import ModelSpec
from .engine.params import GenerationRequest, SamplingParams
from .errors import APIError, model_not_found
from .reply import make_reply_parser
from .schemas import ChatCompletionRequest

OpenStream = Callable[[str, dict[str, Any]], AsyncIterator[list[dict[str, Any]]]]


def sampling_from(req: ChatCompletionRequest) -> SamplingParams:
    p = SamplingParams()
    for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                 "repeat_penalty", "seed"):
        value = getattr(req, name)
        if value is not None:
            setattr(p, name, value)
    if req.grammar:
        p.grammar = req.grammar
    return p


class _Reply:
    """Accumulates one request's engine events."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.finish_reason: str | None = None

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def take(self, ev: dict[str, Any]) -> None:
        if ev["type"] == "start":
            self.prompt_tokens = ev["prompt_tokens"]
            self.cached_tokens = ev["cached_tokens"]
        elif ev["type"] == "text":
            self.text.append(ev["text"])
        elif ev["type"] == "end":
            self.prompt_tokens = ev["prompt_tokens"]
            self.completion_tokens = ev["completion_tokens"]
            self.cached_tokens = ev["cached_tokens"]
            self.finish_reason = ev["finish_reason"]


class ChatService:
    def __init__(self, specs: list[ModelSpec], open_stream: OpenStream) -> None:
        self.models = {s.id: s for s in specs}
        self.open_stream = open_stream

    def _prepare(self, payload: dict[str, Any]) -> tuple[ChatCompletionRequest, ModelSpec, GenerationRequest]:
        req = ChatCompletionRequest.model_validate(payload)
        spec = self.models.get(req.model)
        if spec is None:
            raise model_not_found(req.model)
        prompt = render_prompt(
            spec.chat_template,
            [m.model_dump(exclude_none=True) for m in req.messages],
            tools=[t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None,
            bos_token=spec.bos_token,
            eos_token=spec.eos_token,
        )
        gen = GenerationRequest(
            request_id=uuid.uuid4().hex,
            prompt=prompt,
            max_tokens=req.completion_limit,
            stop=req.stop_list,
            sampling=sampling_from(req),
        )
        return req, spec, gen

    async def complete(self, payload: dict[str, Any]) -> dict[str, Any]:
        req, spec, gen = self._prepare(payload)
        reply = _Reply()
        async for batch in self.open_stream(spec.id, gen.to_dict()):
            for ev in batch:
                reply.take(ev)
        if reply.finish_reason is None:
            raise APIError("The model stream ended without finishing.", status=502, type="server_error",
                           code="incomplete_generation")
        parser = make_reply_parser(spec, req)
        message = parser.parse("".join(reply.text))
        finish = "tool_calls" if message.get("tool_calls") else reply.finish_reason
        return {
            "id": f"chatcmpl-{gen.request_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model,
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
        req, spec, gen = self._prepare(payload)
        parser = make_reply_parser(spec, req)
        reply = _Reply()
        include_usage = req.include_usage
        base = {"id": f"chatcmpl-{gen.request_id}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": req.model}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            c = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            if include_usage:
                c["usage"] = None
            return c

        async for batch in self.open_stream(spec.id, gen.to_dict()):
            out: list[dict[str, Any]] = []
            for ev in batch:
                reply.take(ev)
                if ev["type"] == "start":
                    out.append(chunk({"role": "assistant", "content": ""}))
                elif ev["type"] == "text":
                    out.extend(chunk(d) for d in parser.feed(ev["text"]))
                elif ev["type"] == "end":
                    out.extend(chunk(d) for d in parser.finish())
                    finish = "tool_calls" if parser.made_tool_calls else reply.finish_reason
                    out.append(chunk({}, finish))
                    if include_usage:
                        out.append({**base, "choices": [], "usage": reply.usage()})
            if out:
                yield out
        if reply.finish_reason is None:
            raise APIError("The model stream ended without finishing.", status=502, type="server_error",
                           code="incomplete_generation")
