"""A model's `default_max_tokens` is applied while planning: the engine gets a complete request (its
`max_tokens` set) from the chat route's planning (which Responses and Messages plan through) and from the
legacy completions route's, and never chooses a default itself."""

from __future__ import annotations

import dataclasses

import pytest

from app.api.schemas import CompletionRequest, parse_chat_request, parse_request
from app.completions.service import plan_completion
from app.config.app_args import Limits
from app.config.spec import ModelSpec
from app.generation.plan import plan_request
from app.prompt.tool_calling import resolve_reply_format

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPEC = ModelSpec(id="m", path="/nonexistent.gguf", n_ctx=512, n_seq_max=4, n_batch=64, n_threads=1,
                 n_threads_batch=1, n_gpu_layers=0, kv_unified=True, cpu_extra_buffers="auto",
                 startup_self_check=False, chat_template=TEMPLATE, bos_token="", eos_token="<|im_end|>",
                 reasoning_parser="auto", tool_parser="auto", default_max_tokens=7, max_tokens_limit=100,
                 stream_interval_ms=0, tool_continuation_rounds=0, tool_continuation_tokens=0,
                 owned_by="me", n_vocab=1000)


def chat_limit(spec: ModelSpec, **fields) -> int | None:
    fmt = resolve_reply_format(spec.chat_template, spec.reasoning_parser, spec.tool_parser)
    req = parse_chat_request({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})
    return plan_request(req, spec, fmt, Limits()).gen.max_tokens


def completion_limits(spec: ModelSpec, **fields) -> list[int | None]:
    req = parse_request(CompletionRequest, {"model": "m", "prompt": ["a", "b"], **fields})
    return [g.max_tokens for g in plan_completion(req, spec, Limits()).gens]


@pytest.mark.parametrize("fields, expected", [({}, 7), ({"max_tokens": 3}, 3), ({"max_completion_tokens": 5}, 5)])
def test_chat_planning_applies_the_models_default(fields, expected):
    assert chat_limit(SPEC, **fields) == expected


def test_completions_planning_applies_the_models_default():
    assert completion_limits(SPEC, max_tokens=None) == [7, 7]  # an explicit null: the model's default
    assert completion_limits(SPEC, max_tokens=2) == [2, 2]
    assert completion_limits(SPEC) == [16, 16]  # the route's own default (OpenAI's), as the schema says


def test_without_a_default_the_limit_is_left_to_the_context():
    none = dataclasses.replace(SPEC, default_max_tokens=None)
    assert chat_limit(none) is None and completion_limits(none, max_tokens=None) == [None, None]
