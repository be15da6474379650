"""`/tokenize` and `/detokenize` (vLLM's shapes): count and budget tokens exactly as the model does.

A prompt is tokenized as the legacy route's prompt is; messages are rendered by the chat route's own
planning (template, tools, content marks), so `count` is the `usage.prompt_tokens` that the same
chat request reports. The ids come from the model's replica: it owns the tokenizer.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from ..api.errors import KIND_SERVES, invalid_request
from ..generation.adapters import reached_model
from ..generation.caller import ANONYMOUS, Caller
from ..api.schemas import DetokenizeRequest, TokenizeRequest
from ..config.app_args import Limits
from ..config.spec import ModelSpec
from ..engine.jobs import CountPromptJob, DetokenizeJob, InfillTokensJob, TokenizeJob
from ..engine.params import ImageInput, InfillPrompt, Job
from ..generation.lifecycle import off_loop
from ..generation.plan import (chat_prompt, check_grammar_inputs, check_model_limits, completion_limit,
                               grammar_limits, tool_plan)
from ..prompt import content_marks
from ..prompt.tool_calling import ReplyFormat, resolve_reply_format

R = TypeVar("R")


class ModelTokens(Protocol):
    """The models' tokenizers (the LlamaModel replicas through handles in production)."""

    async def run(self, model_id: str, job: Job[R]) -> R:
        """A TokenizeJob's ids, a DetokenizeJob's text, a CountPromptJob's count (app/engine/jobs.py)."""


async def prompt_count(tokens: ModelTokens, model_id: str, prompt: str, images: list[ImageInput]) -> int:
    """A rendered chat prompt's count as its generation's usage gives it: with images, the model's replica
    counts their positions (its projector's preprocessing); without, its tokenizer alone."""
    if images:
        return await tokens.run(model_id, CountPromptJob(prompt, images))
    return len(await tokens.run(model_id, TokenizeJob(prompt, True)))


def tokenize_text(req: TokenizeRequest, spec: ModelSpec, fmt: ReplyFormat, limits: Limits) -> str:
    """What the model tokenizes for this request: the chat prompt as the chat route renders it
    (content marked), or the prompt as the legacy route takes it."""
    if req.messages is None:
        return content_marks.clean(req.prompt or "")
    chat = req.chat_request()
    check_model_limits(chat, spec)
    check_grammar_inputs(chat, limits)
    return chat_prompt(spec, tool_plan(chat, fmt, grammar_limits(limits)), req.add_generation_prompt)


class TokenService:
    """`/tokenize` and `/detokenize`, the same for every caller (`caller` is the Processing's call shape)."""

    def __init__(self, specs: list[ModelSpec], tokens: ModelTokens, *, limits: Limits | None = None) -> None:
        self.models = {s.id: s for s in specs}
        self.formats = {s.id: resolve_reply_format(s.chat_template, s.reasoning_parser, s.tool_parser)
                        for s in specs if s.kind == "chat"}
        self.tokens = tokens
        self.limits = limits or Limits()

    def _spec(self, model: str, caller: Caller) -> ModelSpec:
        return reached_model(self.models, model, caller.policy)[0]  # `<base>:<adapter>` tokenizes as its base

    async def tokenize(self, req: TokenizeRequest, caller: Caller = ANONYMOUS) -> dict[str, Any]:
        spec = self._spec(req.model, caller)
        if req.infill:
            # As /infill lays it out for a completion of the model's default length (`input_extra` is cut to leave
            # it room); the model's replica refuses a vocabulary without FIM tokens, naming the model.
            extra = tuple((chunk.filename, chunk.text) for chunk in req.input_extra or [])
            if len(extra) > self.limits.max_infill_extra:
                raise invalid_request(f"`input_extra` has {len(extra)} files; this server takes at most "
                                      f"{self.limits.max_infill_extra} in one request (limits.max_infill_extra).",
                                      param="input_extra", code="too_many_inputs")
            infill = InfillPrompt(req.input_prefix or "", req.input_suffix or "", extra, req.prompt or "")
            ids = await self.tokens.run(spec.id, InfillTokensJob(infill, completion_limit(None, spec)))
            return {"tokens": ids, "count": len(ids), "max_model_len": spec.n_ctx}
        if req.messages is not None and spec.kind != "chat":
            what = KIND_SERVES[spec.kind][0]
            raise invalid_request(f"Model `{spec.id}` is {what}: it has no chat template to render "
                                  f"`messages`; send `prompt`.", param="messages", code="unsupported_model")
        if req.messages is None:
            text = tokenize_text(req, spec, self.formats.get(spec.id), self.limits)
        else:
            text = await off_loop(self.limits, caller, tokenize_text, req, spec, self.formats[spec.id], self.limits)
        ids = await self.tokens.run(spec.id, TokenizeJob(text, req.add_special))
        return {"tokens": ids, "count": len(ids), "max_model_len": spec.n_ctx}

    async def detokenize(self, req: DetokenizeRequest, caller: Caller = ANONYMOUS) -> dict[str, Any]:
        spec = self._spec(req.model, caller)
        return {"prompt": await self.tokens.run(spec.id, DetokenizeJob(req.tokens))}
