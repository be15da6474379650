"""Speculative decoding's controls: a request's `speculative` and llama-server's `speculative.n_max` /
`speculative.n_min` reach the engine's GenerationRequest from the chat and the legacy completions routes, bad
values are a 400 naming the parameter, and the model's `speculative` config resolves into its spec."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.api.errors import APIError
from app.api.schemas import ChatCompletionRequest, CompletionRequest, parse_request
from app.completions.service import plan_completion
from app.config.app_args import Limits
from app.config.resolution import speculative_spec
from app.config.schema import ModelConfig, SpeculativeConfig
from app.config.spec import SpeculativeSpec
from app.generation.core import GenerationCore
from tests.generation.test_completion_default import SPEC

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": ["a", "b"]}


def chat_gen(**fields):
    req = parse_request(ChatCompletionRequest, {**CHAT, **fields})
    return GenerationCore([SPEC], generate=None).plan_chat(req, SPEC, "").gen


def completion_gens(**fields):
    return plan_completion(parse_request(CompletionRequest, {**COMPLETION, **fields}), SPEC, Limits()).gens


def test_defaults_leave_it_to_the_model():
    for gen in (chat_gen(), *completion_gens()):
        assert (gen.speculative, gen.spec_n_max, gen.spec_n_min) == (True, None, None)


def test_request_controls_reach_the_engine():
    fields = {"speculative": False, "speculative.n_max": 4, "speculative.n_min": 2}
    for gen in (chat_gen(**fields), *completion_gens(**fields)):
        assert (gen.speculative, gen.spec_n_max, gen.spec_n_min) == (False, 4, 2)


@pytest.mark.parametrize("bad, param", [
    ({"speculative.n_max": -1}, "speculative.n_max"),
    ({"speculative.n_max": 65}, "speculative.n_max"),
    ({"speculative.n_max": 10**12}, "speculative.n_max"),
    ({"speculative.n_max": 2.5}, "speculative.n_max"),
    ({"speculative.n_max": float("nan")}, "speculative.n_max"),
    ({"speculative.n_min": float("inf")}, "speculative.n_min"),
    ({"speculative.n_min": -3}, "speculative.n_min"),
    ({"speculative.n_max": 2, "speculative.n_min": 3}, "speculative.n_min"),
    ({"speculative": "no"}, "speculative"),
])
@pytest.mark.parametrize("route", [ChatCompletionRequest, CompletionRequest])
def test_bad_values_are_a_400_naming_the_parameter(route, bad, param):
    with pytest.raises(APIError) as info:
        parse_request(route, {**(CHAT if route is ChatCompletionRequest else COMPLETION), **bad})
    err = info.value
    assert (err.status, err.type, err.param, err.code) == (400, "invalid_request_error", param, "invalid_value")


def test_model_config():
    assert speculative_spec(None) is None
    assert speculative_spec(SpeculativeConfig(type="none")) is None
    assert speculative_spec(SpeculativeConfig(n_max=5)) == SpeculativeSpec(n_max=5)
    for bad in ({"n_min": 9, "n_max": 8}, {"ngram_min": 4, "ngram_max": 3}, {"n_max": 0}, {"type": "draft"}):
        with pytest.raises(ValidationError):
            SpeculativeConfig(**bad)
    with pytest.raises(ValidationError, match="speculative"):
        ModelConfig(id="e", model_path="/x.gguf", kind="embedding", speculative={"type": "ngram"})


def test_responses_and_messages_pass_the_controls_on():
    from app.anthropic_messages.mapping import to_chat_request
    from app.anthropic_messages.schemas import MessagesRequest
    from app.openai_responses.mapping import chat_request
    from app.openai_responses.schemas import ResponsesRequest

    fields = {"speculative": False, "speculative.n_max": 4, "speculative.n_min": 2}
    responses = ResponsesRequest.model_validate({"model": "m", "input": "hi", **fields})
    messages = MessagesRequest.model_validate({"model": "m", "max_tokens": 5, **fields,
                                               "messages": [{"role": "user", "content": "hi"}]})
    chats = [chat_request(responses, [{"role": "user", "content": "hi"}]), to_chat_request(messages).chat]
    for chat in chats:
        assert (chat.speculative, chat.speculative_n_max, chat.speculative_n_min) == (False, 4, 2)
    plain = MessagesRequest.model_validate({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    assert to_chat_request(plain).chat.speculative is None  # left to the model
    for route, body in ((ResponsesRequest, {"model": "m", "input": "hi"}),
                        (MessagesRequest, {"model": "m", "max_tokens": 5, "messages": []})):
        with pytest.raises(ValidationError, match="speculative.n_max"):
            route.model_validate({**body, "speculative.n_max": 65})
