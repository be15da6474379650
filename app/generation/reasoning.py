"""A request's reasoning controls, in one place: which template switches reach the model's template, and the
budget the engine holds the reply's reasoning to (app/engine/reasoning_budget.py).

What each protocol asks arrives as chat fields (Anthropic's `thinking` and the Responses API's `reasoning.effort`
are mapped onto them), most specific first:

- `thinking_budget_tokens` (llama-server's; Anthropic's `thinking.budget_tokens`): that many tokens, -1 unbounded;
- `chat_template_kwargs.enable_thinking: false` (Anthropic's `thinking: disabled`): no reasoning (0);
- `reasoning_effort` (OpenAI's; the Responses API's `reasoning.effort`): `none` is 0, the others the budget the
  model's entry gives them (`reasoning_budgets`);
- else the model's `reasoning_budget` (default: unbounded).

A switch the template reads (Qwen3's `enable_thinking`) is passed to it as well, so such a template renders its
own way of thinking or not; a template that reads none still gets its budget: 0 closes the reasoning at once.
Only a model whose replies are read for reasoning (`reasoning_parser: think`) has one; others get no limit.
"""

from __future__ import annotations

from typing import Any

from ..api.errors import invalid_request
from ..api.schemas import ChatCompletionRequest
from ..config.spec import ModelSpec
from ..engine.params import ReasoningLimit
from ..prompt.chat_template import declared_variables
from ..prompt.content_marks import CLOSE, OPEN
from ..prompt.tool_calling import ReplyFormat

START, END = "<think>", "</think>"  # the `think` parser's markers (app/parsers/reasoning.py)


def template_switches(req: ChatCompletionRequest, spec: ModelSpec) -> dict[str, Any]:
    """The request's template switches (`chat_template_kwargs`, checked against the known ones by its schema)
    that the model's template reads."""
    switches = req.chat_template_kwargs or {}
    if not switches:
        return {}
    declared = declared_variables(spec.chat_template)
    return {key: value for key, value in switches.items() if key in declared}


def requested_budget(req: ChatCompletionRequest, spec: ModelSpec) -> int | None:
    """The reply's reasoning budget in tokens (None: unbounded), from the request's fields as the module says; a
    400 naming the field for a budget the model cannot give."""
    limit = spec.max_tokens_limit or spec.n_ctx
    off = (req.chat_template_kwargs or {}).get("enable_thinking") is False
    asked = req.thinking_budget_tokens
    if asked is not None:
        if asked > limit:
            raise invalid_request(f"`thinking_budget_tokens` is too large: {asked}. Model `{spec.id}` generates at "
                                  f"most {limit} tokens in a reply (-1: no budget).", param="thinking_budget_tokens",
                                  code="thinking_budget_too_large")
        if off and asked != 0:
            raise invalid_request(f"`thinking_budget_tokens` is {asked} while `chat_template_kwargs.enable_thinking` "
                                  f"is false (no reasoning): send one of them.", param="thinking_budget_tokens")
        return None if asked == -1 else asked
    if off or req.reasoning_effort == "none":
        return 0
    if req.reasoning_effort is not None:
        return dict(spec.reasoning_budgets).get(req.reasoning_effort)
    return spec.reasoning_budget


def opens_reasoning(prompt: str, start: str = START, end: str = END) -> bool:
    """Whether a rendered prompt leaves the reply inside its reasoning: the template's text after the last client
    text (the generation prompt) opens `start` and does not close it (DeepSeek-R1's and Qwen3-Thinking's
    `<think>\\n`; not Qwen3's `<think>\\n\\n</think>` with thinking switched off)."""
    tail = prompt[max(prompt.rfind(OPEN), prompt.rfind(CLOSE)) + 1:]
    at = tail.rfind(start)
    return at >= 0 and tail.find(end, at) < 0


def reasoning_limit(req: ChatCompletionRequest, spec: ModelSpec, fmt: ReplyFormat, prompt: str) -> ReasoningLimit | None:
    """What the engine follows and bounds of the reply's reasoning (None: a model whose replies hold none; its
    request's budget fields are still checked, so a budget out of range is refused whatever the model)."""
    budget = requested_budget(req, spec)
    if fmt.reasoning != "think":
        return None
    return ReasoningLimit(start=START, end=END, budget=budget, starts_open=opens_reasoning(prompt),
                          message=spec.reasoning_close)
