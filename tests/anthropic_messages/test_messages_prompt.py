"""A Messages request renders the prompt chat renders for the request it maps to, with `thinking` given to
the template as `enable_thinking`; count_tokens counts exactly that prompt."""

from __future__ import annotations

from dataclasses import replace

from app.anthropic_messages.count import prompt_text
from app.anthropic_messages.mapping import to_chat_request
from app.anthropic_messages.schemas import parse_count_tokens_request, parse_messages_request
from app.generation.plan import plan_request
from app.config.app_args import Limits
from app.prompt.tool_calling import resolve_reply_format

SWITCHED = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and enable_thinking %}<think>"
            "{% elif enable_thinking is defined %}<think></think>{% endif %}{% endif %}")


def render(spec, **fields) -> tuple[str, str]:
    """The generation's prompt and the token count's, for the same conversation."""
    body = {"model": spec.id, "messages": [{"role": "user", "content": "Hi"}], **fields}
    fmt = resolve_reply_format(spec.chat_template, spec.reasoning_parser, spec.tool_parser)
    mapped = to_chat_request(parse_messages_request({**body, "max_tokens": 64}))
    gen = plan_request(mapped.chat, spec, fmt, Limits()).gen.prompt
    return gen, prompt_text(parse_count_tokens_request(body), spec, fmt, Limits())[0]


def test_thinking_switches_the_template(bundled_spec):
    spec = replace(bundled_spec, chat_template=SWITCHED)
    assert render(spec)[0].endswith("<assistant>")
    assert render(spec, thinking={"type": "enabled", "budget_tokens": 1024})[0].endswith("<assistant><think>")
    assert render(spec, thinking={"type": "disabled"})[0].endswith("<assistant><think></think>")


def test_count_tokens_renders_the_generations_prompt(bundled_spec):
    tools = [{"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}}}]
    for fields in ({}, {"system": "Be brief."}, {"tools": tools, "tool_choice": {"type": "any"}},
                   {"thinking": {"type": "disabled"}}):
        generation, count = render(bundled_spec, **fields)
        assert generation == count and "Hi" in count
    assert render(bundled_spec, tools=tools)[0] != render(bundled_spec)[0]
