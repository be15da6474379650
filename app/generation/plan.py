"""Planning: a validated chat request and its model -> what to generate (prompt, sampling, grammar,
limits) and how to read the reply. Pure: no I/O, no event loop; the generation core (core.py) runs it off the loop."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from ..api import strict_json
from ..api.errors import invalid_request
from ..api.schemas import ChatCompletionRequest, CompletionRequest
from ..config.app_args import Limits
from ..config.spec import ModelSpec
from ..engine.params import GenerationRequest, SamplingParams
from ..grammar.request_grammars import GrammarLimits, client_grammar, json_grammar
from ..parsers import ReplyParser
from ..prompt.prompt_check import checked_prompt
from ..prompt.tool_calling import ReplyFormat, ToolPlan, plan_tools
from .images import check_images
from .reasoning import reasoning_limit, template_switches

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                   "repeat_penalty", "seed")


@dataclass(frozen=True)
class GenerationPlan:
    req: ChatCompletionRequest
    spec: ModelSpec
    gen: GenerationRequest
    fmt: ReplyFormat
    tool_parser: str | None  # None: the reply is not read for tool calls

    def reply_parser(self) -> ReplyParser:
        """A fresh parser for this request's reply (the model's format, the request's switches)."""
        return ReplyParser(
            reasoning=self.fmt.reasoning, tools=self.tool_parser,
            include_reasoning=self.req.include_reasoning is not False,
            parallel_tool_calls=self.req.parallel_tool_calls is not False,
            starts_in_reasoning=self.gen.reasoning.starts_open if self.gen.reasoning is not None
            else self.fmt.starts_in_reasoning,
            tool_names=frozenset(t.function.name for t in self.req.tools or []) or None)


def plan_request(req: ChatCompletionRequest, spec: ModelSpec, fmt: ReplyFormat, limits: Limits) -> GenerationPlan:
    check_images(req, spec, limits)
    check_model_limits(req, spec, images=True)
    check_grammar_inputs(req, limits)
    schema_limits = grammar_limits(limits)
    tools = tool_plan(req, fmt, schema_limits)
    # A forced call's grammar wins over a free-form format.
    grammar = tools.grammar or format_grammar(req, limits)
    prompt = chat_prompt(spec, tools, template_kwargs=template_variables(req, spec))
    sampling = sampling_from(req, spec.n_vocab)
    sampling.grammar = grammar
    gen = GenerationRequest(request_id=uuid.uuid4().hex, prompt=prompt,
                            max_tokens=completion_limit(req.completion_limit, spec), stop=req.stop_list, sampling=sampling, n=req.choices, logprobs=req.logprobs_k,
                            return_tokens=tools.parser is not None and spec.tool_continuation_rounds > 0,
                            max_logprob_entries=limits.max_logprob_entries,
                            reasoning=reasoning_limit(req, spec, fmt, prompt))
    return GenerationPlan(req, spec, gen, fmt, tools.parser)


def tool_plan(req: ChatCompletionRequest, fmt: ReplyFormat, schema_limits: GrammarLimits) -> ToolPlan:
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    return plan_tools(fmt, req, messages, schema_limits)


def chat_prompt(spec: ModelSpec, tools: ToolPlan, add_generation_prompt: bool = True,
                template_kwargs: dict[str, Any] | None = None) -> str:
    """The prompt the model's template renders for the request's messages (and tools), client text marked
    and checked: its control tokens are the template's own (prompt_check)."""
    return checked_prompt(spec.chat_template, tools.messages, tools=tools.template_tools,
                          add_generation_prompt=add_generation_prompt, bos_token=spec.bos_token,
                          eos_token=spec.eos_token, control_tokens=spec.control_tokens, extra=template_kwargs)


def template_variables(req: ChatCompletionRequest, spec: ModelSpec) -> dict[str, Any] | None:
    """The request's variables for the chat template beyond messages and tools (None: none): its
    `reasoning_effort` (a template that does not read it renders as without it) and the switches of
    `chat_template_kwargs` the template reads (app/generation/reasoning.py), never a client's free-form dict."""
    effort = getattr(req, "reasoning_effort", None)
    out = {"reasoning_effort": effort} if effort is not None else {}
    out.update(template_switches(req, spec))
    return out or None


def sampling_from(req: ChatCompletionRequest | CompletionRequest, n_vocab: int = 0) -> SamplingParams:
    """The request's sampling fields (same names on the chat and the legacy route) over llama.cpp's defaults."""
    p = SamplingParams()
    for name in SAMPLING_FIELDS:
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
    return GrammarLimits(max_repetition=limits.max_schema_repetition, max_depth=limits.max_schema_depth)


def format_grammar(req: ChatCompletionRequest, limits: Limits) -> str | None:
    """The grammar (llguidance's) `response_format` or the llama.cpp-style GBNF `grammar` field asks for."""
    fmt = req.response_format
    wants_json = fmt is not None and fmt.type != "text"
    if wants_json and req.grammar:
        raise invalid_request("Use either `response_format` or `grammar`, not both.", param="grammar")
    if req.grammar or not wants_json:
        return client_gbnf(req.grammar, limits)
    schema_limits = grammar_limits(limits)
    if fmt.type == "json_object":
        return json_grammar({"type": "object"}, "response_format", schema_limits)
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise invalid_request("`response_format.json_schema.schema` is required for type `json_schema`.",
                              param="response_format.json_schema")
    return json_grammar(fmt.json_schema.schema_, "response_format.json_schema.schema", schema_limits)


def check_model_limits(req: ChatCompletionRequest, spec: ModelSpec, images: bool = False) -> None:
    """Content the model cannot take here, and its completion limit: a 400 that names the limit (as
    OpenAI answers), never a silent clamp. `images`: image parts pass (generation and the counting routes,
    after check_images); /tokenize, which lists token ids, refuses them."""
    taken = ("text", "refusal", "image_url") if images else ("text", "refusal")
    for i, msg in enumerate(req.messages):
        for j, part in enumerate(msg.content if isinstance(msg.content, list) else []):
            if part.type not in taken:
                what = ("/tokenize lists token ids, which an image has none of (/v1/messages/count_tokens and "
                        "/v1/responses/input_tokens count images)" if part.type == "image_url" and spec.takes_images
                        else f"model `{spec.id}` takes text only")
                raise invalid_request(f"`{part.type}` content is not supported: {what}.",
                                      param=f"messages[{i}].content[{j}].type", code="unsupported_content")
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    check_completion_limit(req.completion_limit, param, spec)


def completion_limit(asked: int | None, spec: ModelSpec) -> int | None:
    """The completion's token limit the engine gets: the request's, else the model's `default_max_tokens`
    (None: neither, and the engine generates until the context is full)."""
    return asked if asked is not None else spec.default_max_tokens


def check_completion_limit(asked: int | None, param: str, spec: ModelSpec) -> None:
    limit = spec.max_tokens_limit or spec.n_ctx
    if asked is not None and asked > limit:
        raise invalid_request(f"`{param}` is too large: {asked}. This model supports at most {limit} completion tokens.",
                              param=param, code="max_tokens_exceeded")


def check_grammar_inputs(req: ChatCompletionRequest, limits: Limits) -> None:
    """Sizes of what becomes a grammar (`grammar`, `tools`), before any grammar work starts."""
    check_client_grammar(req.grammar, limits)
    if not req.tools:
        return
    if len(req.tools) > limits.max_tools:
        raise invalid_request(f"Too many tools: {len(req.tools)} (at most {limits.max_tools}, limits.max_tools).",
                              param="tools", code="too_many_tools")
    size = len(strict_json.dumps([t.model_dump(exclude_none=True) for t in req.tools], compact=False,
                                  ensure_ascii=True))
    if size > limits.max_tools_bytes:
        raise invalid_request(f"`tools` is {size} bytes as JSON; at most {limits.max_tools_bytes} are accepted "
                              f"(limits.max_tools_bytes).", param="tools", code="tools_too_large")


def check_client_grammar(grammar: str | None, limits: Limits) -> None:
    """A client's GBNF `grammar`: its size and encoding, before anything reads it."""
    if grammar is None:
        return
    if "\x00" in grammar:
        raise invalid_request("`grammar` contains a NUL character.", param="grammar", code="invalid_grammar")
    try:
        size = len(grammar.encode("utf-8"))
    except UnicodeEncodeError:
        raise invalid_request("`grammar` is not valid UTF-8 (it holds a lone surrogate).", param="grammar",
                              code="invalid_grammar") from None
    if size > limits.max_grammar_bytes:
        raise invalid_request(f"`grammar` is {size} bytes; this server accepts grammars of at most "
                              f"{limits.max_grammar_bytes} bytes (limits.max_grammar_bytes).", param="grammar",
                              code="grammar_too_large")


def client_gbnf(grammar: str | None, limits: Limits) -> str | None:
    """A client's GBNF `grammar` (llama.cpp's syntax, as llama-server takes it) as llguidance's grammar."""
    if grammar is None:
        return None
    check_client_grammar(grammar, limits)
    return client_grammar(grammar, "grammar", limits.max_grammar_depth, limits.max_schema_repetition)
