"""`POST /v1/messages/count_tokens`: the prompt a Messages request renders (mapped and planned as its
generation would be: template, tools, thinking switch, content marks), counted by the model's tokenizer.
So `input_tokens` equals the generation's `usage.input_tokens + usage.cache_read_input_tokens`."""

from __future__ import annotations

from typing import Any

from ..api.errors import model_not_found
from ..chat.plan import chat_prompt, check_grammar_inputs, check_model_limits, grammar_limits, tool_plan
from ..config.settings import Limits, ModelSpec
from ..prompt.tokens import ModelTokens
from ..prompt.tool_calling import ReplyFormat, resolve_reply_format
from ..serving.lifecycle import off_loop
from .mapping import to_chat_request
from .schemas import CountTokensRequest
from .shaping import count_tokens_body


def prompt_text(req: CountTokensRequest, spec: ModelSpec, fmt: ReplyFormat, limits: Limits) -> str:
    mapped = to_chat_request(req)
    check_model_limits(mapped.chat, spec)
    check_grammar_inputs(mapped.chat, limits)
    return chat_prompt(spec, tool_plan(mapped.chat, fmt, grammar_limits(limits)), True, mapped.template_kwargs)


class MessageTokenCounter:
    def __init__(self, specs: list[ModelSpec], tokens: ModelTokens, *, limits: Limits | None = None) -> None:
        self.models = {s.id: s for s in specs}
        self.formats = {s.id: resolve_reply_format(s.chat_template, s.reasoning_parser, s.tool_parser)
                        for s in specs}
        self.tokens = tokens
        self.limits = limits or Limits()

    async def count(self, req: CountTokensRequest) -> dict[str, Any]:
        spec = self.models.get(req.model)
        if spec is None:
            raise model_not_found(req.model)
        text = await off_loop(self.limits, prompt_text, req, spec, self.formats[spec.id], self.limits)
        return count_tokens_body(len(await self.tokens.tokenize(spec.id, text, True)))
