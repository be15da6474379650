"""`POST /v1/messages/count_tokens`: the prompt a Messages request renders (mapped and planned as its
generation would be: template, tools, thinking switch, content marks), counted by the model's tokenizer.
So `input_tokens` equals the generation's `usage.input_tokens + usage.cache_read_input_tokens`."""

from __future__ import annotations

from typing import Any

from ..generation.adapters import served_target
from ..generation.caller import ANONYMOUS, Caller
from ..api.schemas import ChatCompletionRequest
from ..generation.images import check_images, load_images
from ..generation.plan import (chat_prompt, check_grammar_inputs, check_model_limits, grammar_limits,
                               template_variables, tool_plan)
from ..config.app_args import Limits
from ..config.spec import ModelSpec
from ..tokenize.service import ModelTokens, prompt_count
from ..prompt.tool_calling import ReplyFormat, resolve_reply_format
from ..generation.lifecycle import off_loop
from .mapping import to_chat_request
from .schemas import CountTokensRequest
from .shaping import count_tokens_body


def prompt_text(req: CountTokensRequest, spec: ModelSpec, fmt: ReplyFormat,
                limits: Limits) -> tuple[str, ChatCompletionRequest]:
    """The rendered prompt, and the chat request it was rendered from (its images, if any, to load)."""
    mapped = to_chat_request(req)
    check_images(mapped.chat, spec, limits)
    check_model_limits(mapped.chat, spec, images=True)
    check_grammar_inputs(mapped.chat, limits)
    text = chat_prompt(spec, tool_plan(mapped.chat, fmt, grammar_limits(limits)), True,
                       template_variables(mapped.chat, spec))
    return text, mapped.chat


class MessageTokenCounter:
    def __init__(self, specs: list[ModelSpec], tokens: ModelTokens, *, limits: Limits | None = None) -> None:
        self.models = {s.id: s for s in specs}
        self.formats = {s.id: resolve_reply_format(s.chat_template, s.reasoning_parser, s.tool_parser)
                        for s in specs}
        self.tokens = tokens
        self.limits = limits or Limits()

    async def count(self, req: CountTokensRequest, caller: Caller = ANONYMOUS) -> dict[str, Any]:
        spec = served_target(self.models, req.model, "chat", "/v1/messages/count_tokens",
                             policy=caller.policy).spec  # an adapter counts as its base
        text, chat = await off_loop(self.limits, caller, prompt_text, req, spec, self.formats[spec.id], self.limits)
        images = await load_images(chat, self.limits, caller.tenant)
        return count_tokens_body(await prompt_count(self.tokens, spec.id, text, images))
