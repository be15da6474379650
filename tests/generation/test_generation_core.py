"""The generation core (app/generation/core.py, reading.py) and its adapters: one reply read by the core comes
out of chat completions, Responses and Messages as the same text and finish, each service composing the core
(none is another's subclass); the reader's stream events carry each token's logprobs once, and its whole
results are what its stream said."""

from __future__ import annotations

import asyncio

import pytest

from app.anthropic_messages import MessagesService
from app.anthropic_messages.schemas import parse_messages_request
from app.api.schemas import parse_chat_request
from app.chat import ChatService
from app.completions import CompletionService
from app.engine.events import Finished, Started, Text, TokenLogprob
from app.generation.core import GenerationCore
from app.generation.plan import plan_request
from app.generation.reading import Closed, Delta, Opened, ReplyReader
from app.openai_responses.schemas import parse_responses_request
from app.openai_responses.service import ResponsesService
from app.prompt.tool_calling import resolve_reply_format
from app.config.app_args import Limits
from tests.generation.test_lifecycle import MODEL, SPEC

WORDS = ("The answer ", "is 4.")


async def say(model_id: str, gen):
    yield [Started(3, 0)]
    for word in WORDS:
        yield [Text(word, 1, logprobs=(TokenLogprob(word.encode(), -0.5, ()),) if gen.logprobs is not None else ())]
    yield [Finished("stop", 3, len(WORDS), 0)]


SERVICES = [ChatService, CompletionService, ResponsesService, MessagesService]


@pytest.mark.parametrize("cls", SERVICES, ids=lambda c: c.__name__)
def test_each_service_composes_and_subclasses_no_other(cls):
    assert all(not issubclass(cls, other) for other in SERVICES if other is not cls)
    service = cls([SPEC], say)
    if cls is not CompletionService:  # the legacy route plans without a template: no chat-shaped turn
        assert isinstance(service.core, GenerationCore)


def test_one_reply_in_three_protocols():
    chat = asyncio.run(ChatService([SPEC], say).complete(parse_chat_request(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})))
    response = asyncio.run(ResponsesService([SPEC], say).complete(parse_responses_request(
        {"model": MODEL, "input": "hi", "store": False})))
    message = asyncio.run(MessagesService([SPEC], say).complete(parse_messages_request(
        {"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})))
    text = "".join(WORDS)
    assert chat["choices"][0]["message"]["content"] == text and chat["choices"][0]["finish_reason"] == "stop"
    assert response["output_text"] == text and response["status"] == "completed"
    assert message["content"] == [{"type": "text", "text": text, "citations": None}]
    assert message["stop_reason"] == "end_turn"
    assert chat["usage"]["completion_tokens"] == response["usage"]["output_tokens"] == \
        message["usage"]["output_tokens"] == len(WORDS)


def test_the_reader_streams_each_logprob_once_and_its_results_agree():
    req = parse_chat_request({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "logprobs": True})
    plan = plan_request(req, SPEC, resolve_reply_format(SPEC.chat_template, "auto", "auto"), Limits())
    streamed, whole = ReplyReader(plan), ReplyReader(plan)
    core = GenerationCore([SPEC], say)

    async def run() -> list:
        out = []
        async for batch in core.events(plan, streamed):
            out += streamed.feed(batch)
        async for batch in core.events(plan, whole):
            whole.read(batch)
        return out

    events = asyncio.run(run())
    assert isinstance(events[0], Opened) and isinstance(events[-1], Closed) and streamed.ended
    deltas = [e for e in events if isinstance(e, Delta)]
    assert "".join(d.delta.get("content", "") for d in deltas) == "".join(WORDS)
    sent = [lp.token for e in events if isinstance(e, (Delta, Closed)) and e.logprobs for lp in e.logprobs]
    assert sent == [w.encode() for w in WORDS]
    [result] = whole.results()
    assert result.message["content"] == "".join(WORDS) and result.finish_reason == events[-1].finish_reason
    assert [lp.token for lp in result.logprobs] == sent
    assert whole.usage() == streamed.usage() == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                                                 "prompt_tokens_details": {"cached_tokens": 0},
                                                 "completion_tokens_details": {"reasoning_tokens": 0}}
