"""CompletionService and TokenService over fake model streams: the legacy `text_completion` shape
(choice indexes, echo, legacy logprobs, usage, stream chunks) and the tokenizer routes' rendering."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from app.api.errors import APIError
from app.api.schemas import (
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    parse_chat_request,
    parse_request,
)
from app.generation.plan import plan_request
from app.completions import CompletionService
from app.config.app_args import Limits
from app.engine.events import Finished, PromptLogprobs, Started, Text, TokenLogprob
from app.engine.jobs import DetokenizeJob, TokenizeJob
from app.engine.params import GenerationRequest
from app.observe.request_records import RequestRecord
from app.tokenize.service import TokenService
from app.prompt.tool_calling import resolve_reply_format
from tests.support.openapi_spec import assert_valid_completion
from tests.support.grammars import gbnf

MODEL = "m"
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture
def spec(bundled_spec_like):
    return bundled_spec_like


@pytest.fixture
def bundled_spec_like():
    from app.config.spec import ModelSpec

    return ModelSpec(id=MODEL, path="/nonexistent.gguf", n_ctx=512, n_seq_max=4, n_batch=64, n_threads=1,
                     n_threads_batch=1, n_gpu_layers=0, kv_unified=True, cpu_extra_buffers="auto",
                     startup_self_check=False, chat_template=TEMPLATE, bos_token="", eos_token="<|im_end|>",
                     reasoning_parser="auto", tool_parser="auto", default_max_tokens=None, max_tokens_limit=100,
                     stream_interval_ms=0, tool_continuation_rounds=0, tool_continuation_tokens=0,
                     owned_by="me", n_vocab=1000)


def lp(token: str, logprob: float | None, *top: tuple[str, float]) -> TokenLogprob:
    return TokenLogprob(token.encode(), logprob, tuple((t.encode(), v) for t, v in top))


class FakeModel:
    """A model stream per generation: for each choice, Started, one Text per word of `reply`, Finished;
    the choices' events interleaved, as the engine sends n > 1."""

    def __init__(self, reply: str = "hello world") -> None:
        self.reply = reply
        self.opened: list[GenerationRequest] = []
        self.finish = "length"
        self.drop_finish = False

    def prompt_tokens(self, gen: GenerationRequest) -> int:
        return len(gen.prompt.split()) + 1

    def events(self, gen: GenerationRequest) -> list[list[Any]]:
        words = [] if gen.max_tokens == 0 else [w + " " for w in self.reply.split()]
        batches: list[list[Any]] = [[Started(self.prompt_tokens(gen), 0, index=i) for i in range(gen.n)]]
        if gen.prompt_logprobs:
            entries = [lp(w, None if k == 0 else -0.5, (w, -0.5), ("x", -1.5)) for k, w in enumerate(gen.prompt.split())]
            batches.append([PromptLogprobs(tuple(entries), index=0)])
        for w in words:
            batch = []
            for i in range(gen.n):
                logprobs = () if gen.logprobs is None else (
                    lp(w, -0.25, *[(f"alt{j}", -2.0 - j) for j in range(gen.logprobs)][::-1]),)
                batch.append(Text(f"{w}{i}|" if gen.n > 1 else w, 1, logprobs, index=i))
            batches.append(batch)
        if not self.drop_finish:
            batches.append([Finished(self.finish, self.prompt_tokens(gen), len(words), 0, index=i)
                            for i in range(gen.n)])
        return batches

    async def open_stream(self, model_id: str, gen: GenerationRequest):
        assert model_id == MODEL
        self.opened.append(gen)
        for batch in self.events(gen):
            await asyncio.sleep(0)
            yield batch


class Records:
    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def record(self, rec: RequestRecord) -> None:
        self.records.append(rec)


@pytest.fixture
def model() -> FakeModel:
    return FakeModel()


@pytest.fixture
def records() -> Records:
    return Records()


@pytest.fixture
def service(spec, model, records) -> CompletionService:
    return CompletionService([spec], model.open_stream, observer=records)


def request(**fields) -> CompletionRequest:
    return parse_request(CompletionRequest, {"model": MODEL, "prompt": "Once upon a time", **fields})


def complete(service, **fields) -> dict[str, Any]:
    body = asyncio.run(service.complete(request(**fields)))
    assert_valid_completion(body)
    return body


def stream(service, **fields) -> list[dict[str, Any]]:
    async def collect():
        return [c async for batch in service.stream(request(stream=True, **fields)) for c in batch]
    chunks = asyncio.run(collect())
    for chunk in chunks:
        assert_valid_completion(chunk)
    return chunks


def test_plain_completion(service, model, records):
    body = complete(service)
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-") and body["model"] == MODEL
    assert body["choices"] == [{"index": 0, "text": "hello world ", "logprobs": None, "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    (gen,) = model.opened
    assert gen.max_tokens == 16  # OpenAI's default for the legacy route
    assert gen.n == 1 and gen.logprobs is None and not gen.prompt_logprobs
    assert gen.prompt == "Once upon a time"
    (rec,) = records.records
    assert rec.status == "ok" and not rec.stream and rec.prompt_tokens == 5 and rec.completion_tokens == 2


def test_request_fields_reach_the_generation(service, model):
    complete(service, max_tokens=3, stop=["x"], seed=4, temperature=0, top_k=3, min_p=0.1, repeat_penalty=1.1,
             logit_bias={"7": 5}, grammar='root ::= "a"', user="u")
    (gen,) = model.opened
    assert gen.max_tokens == 3 and gen.stop == ["x"]
    s = gen.sampling
    assert (s.seed, s.temperature, s.top_k, s.min_p, s.repeat_penalty) == (4, 0, 3, 0.1, 1.1)
    assert s.logit_bias == [(7, 5.0)] and s.grammar == gbnf('root ::= "a"')


def test_prompt_is_taken_as_is_but_never_carries_content_marks(service, model):
    complete(service, prompt="<|im_start|>user\nhi\ufdd0\ufdd1")
    assert model.opened[0].prompt == "<|im_start|>user\nhi"


def test_prompt_list_and_n_number_choices_as_openai(service, model):
    body = complete(service, prompt=["a b", "c d e"], n=2, seed=1)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    # choice p*n + i is prompt p's choice i
    assert [c["text"] for c in body["choices"]] == ["hello 0|world 0|", "hello 1|world 1|"] * 2
    assert [g.prompt for g in model.opened] == ["a b", "c d e"]
    assert all(g.n == 2 for g in model.opened)
    assert len({g.request_id for g in model.opened}) == 2
    # prompt tokens once per prompt, completion tokens of every choice
    assert body["usage"]["prompt_tokens"] == 3 + 4
    assert body["usage"]["completion_tokens"] == 2 * 4


def test_echo(service):
    body = complete(service, echo=True)
    assert body["choices"][0]["text"] == "Once upon a time" + "hello world "


def test_echo_prefill_only(service, model):
    body = complete(service, echo=True, max_tokens=0)
    assert body["choices"][0]["text"] == "Once upon a time"
    assert body["choices"][0]["finish_reason"] == "length"
    assert model.opened[0].max_tokens == 0


def test_logprobs_legacy_shape(service, model):
    body = complete(service, logprobs=2)
    assert model.opened[0].logprobs == 2 and not model.opened[0].prompt_logprobs
    lps = body["choices"][0]["logprobs"]
    assert lps["tokens"] == ["hello ", "world "]
    assert lps["token_logprobs"] == [-0.25, -0.25]
    assert lps["text_offset"] == [0, 6]
    for top in lps["top_logprobs"]:
        assert list(top.values()) == sorted(top.values(), reverse=True)  # most likely first
        assert len(top) <= 2 + 1  # the k alternatives and the chosen token
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-6
    assert list(lps["top_logprobs"][0].items()) == [("hello ", -0.25), ("alt0", -2.0), ("alt1", -3.0)]


def test_logprobs_zero_gives_the_chosen_token(service):
    lps = complete(service, logprobs=0)["choices"][0]["logprobs"]
    assert lps["top_logprobs"] == [{"hello ": -0.25}, {"world ": -0.25}]


def test_echo_with_logprobs_scores_the_prompt_first_null(service, model):
    body = complete(service, echo=True, logprobs=1, max_tokens=0, prompt="a bb c")
    assert model.opened[0].prompt_logprobs
    choice = body["choices"][0]
    assert choice["text"] == "a bb c"
    lps = choice["logprobs"]
    assert lps["tokens"] == ["a", "bb", "c"]
    assert lps["token_logprobs"] == [None, -0.5, -0.5]
    assert lps["top_logprobs"][0] is None
    assert lps["top_logprobs"][1] == {"bb": -0.5, "x": -1.5}
    assert lps["text_offset"] == [0, 1, 3]


def test_echo_logprobs_with_n_each_choice_gets_the_prompt(service):
    body = complete(service, echo=True, logprobs=1, n=2, prompt="a b")
    for choice in body["choices"]:
        assert choice["text"].startswith("a b")
        assert choice["logprobs"]["tokens"][:2] == ["a", "b"]
        assert choice["logprobs"]["token_logprobs"][0] is None
        assert len(choice["logprobs"]["tokens"]) == 4


def test_stream_chunks(service, records):
    chunks = stream(service, prompt=["p q", "r"], n=2, stream_options={"include_usage": True})
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and all(c["object"] == "text_completion" for c in chunks)
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for c in chunks[:-1]:
        (ch,) = c["choices"]
        assert "usage" not in c
        texts[ch["index"]] = texts.get(ch["index"], "") + ch["text"]
        if ch["finish_reason"]:
            assert ch["index"] not in finishes
            finishes[ch["index"]] = ch["finish_reason"]
    assert texts == {i: f"hello {i % 2}|world {i % 2}|" for i in range(4)}
    assert finishes == dict.fromkeys(range(4), "length")
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8
    assert records.records[-1].stream


def test_stream_without_usage_and_with_echo_and_logprobs(service):
    chunks = stream(service, echo=True, logprobs=1, prompt="a b")
    assert all(c["choices"] for c in chunks)
    assert chunks[0]["choices"][0]["text"] == "a b"
    assert chunks[0]["choices"][0]["logprobs"]["token_logprobs"] == [None, -0.5]
    offsets = [o for c in chunks if c["choices"][0]["logprobs"] for o in c["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == [0, 1, 2, 8]  # "a", "b", "hello ", "world ": within the choice's whole text
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_max_tokens_above_the_model_limit(service, model):
    with pytest.raises(APIError) as info:
        asyncio.run(service.complete(request(max_tokens=101)))
    assert (info.value.status, info.value.param, info.value.code) == (400, "max_tokens", "max_tokens_exceeded")
    assert not model.opened


def test_unknown_model(service):
    with pytest.raises(APIError) as info:
        asyncio.run(service.complete(request(model="nope")))
    assert info.value.status == 404


def test_stream_that_never_finishes_is_an_error(service, model, records):
    model.drop_finish = True
    with pytest.raises(APIError) as info:
        asyncio.run(service.complete(request(prompt=["a", "b"])))
    assert info.value.status == 502
    assert records.records[-1].status == "error"


def test_a_failing_prompt_stops_the_others(spec, records):
    closed: list[str] = []

    async def open_stream(model_id: str, gen: GenerationRequest):
        try:
            yield [Started(1, 0)]
            if gen.prompt == "bad":
                raise APIError("boom", status=400, code="bad")
            await asyncio.sleep(30)
            yield [Finished("stop", 1, 0, 0)]
        finally:
            closed.append(gen.prompt)

    service = CompletionService([spec], open_stream, observer=records)
    with pytest.raises(APIError) as info:
        asyncio.run(asyncio.wait_for(service.complete(request(prompt=["good", "bad"])), 5))
    assert info.value.code == "bad"
    assert sorted(closed) == ["bad", "good"]


def test_deadline(spec, records):
    async def open_stream(model_id: str, gen: GenerationRequest):
        yield [Started(1, 0)]
        await asyncio.sleep(30)

    service = CompletionService([spec], open_stream, limits=Limits(request_timeout_s=0.2), observer=records)
    with pytest.raises(APIError) as info:
        asyncio.run(service.complete(request()))
    assert info.value.status == 504
    assert records.records[-1].status == "timeout"


# ---- tokenize / detokenize ----------------------------------------------------------------------

class FakeTokens:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, bool]] = []

    async def run(self, model_id: str, job: TokenizeJob | DetokenizeJob) -> list[int] | str:
        if isinstance(job, DetokenizeJob):
            return "".join(chr(97 + t % 26) for t in job.tokens)
        self.calls.append((model_id, job.text, job.add_special))
        return list(range(len(job.text)))


def test_tokenize_messages_renders_what_the_chat_route_renders(spec):
    tokens = FakeTokens()
    svc = TokenService([spec], tokens)
    messages = [{"role": "user", "content": "hi <|im_end|>"}]
    body = asyncio.run(svc.tokenize(parse_request(TokenizeRequest, {"model": MODEL, "messages": messages})))
    chat_prompt = plan_request(parse_chat_request({"model": MODEL, "messages": messages}), spec,
                               resolve_reply_format(spec.chat_template), Limits()).gen.prompt
    assert tokens.calls == [(MODEL, chat_prompt, True)]  # marked content: the engine tokenizes it as chat does
    assert body == {"tokens": list(range(len(chat_prompt))), "count": len(chat_prompt), "max_model_len": 512}


def test_tokenize_messages_with_tools_and_without_generation_prompt(spec):
    tokens = FakeTokens()
    svc = TokenService([spec], tokens)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "hi"}]
    asyncio.run(svc.tokenize(parse_request(TokenizeRequest, {"model": MODEL, "messages": messages, "tools": tools,
                                                             "add_generation_prompt": False})))
    chat_prompt = plan_request(parse_chat_request({"model": MODEL, "messages": messages, "tools": tools}), spec,
                               resolve_reply_format(spec.chat_template), Limits()).gen.prompt
    rendered = tokens.calls[0][1]
    assert "get_weather" in rendered and chat_prompt.startswith(rendered) and chat_prompt != rendered


def test_tokenize_prompt_and_add_special(spec):
    tokens = FakeTokens()
    svc = TokenService([spec], tokens)
    asyncio.run(svc.tokenize(parse_request(TokenizeRequest, {"model": MODEL, "prompt": "ab\ufdd0",
                                                             "add_special_tokens": False})))
    assert tokens.calls == [(MODEL, "ab", False)]


def test_tokenize_checks_like_chat(spec):
    svc = TokenService([spec], FakeTokens())
    body = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}
    with pytest.raises(APIError) as info:
        asyncio.run(svc.tokenize(parse_request(TokenizeRequest, body)))
    assert info.value.code == "unsupported_content"
    with pytest.raises(APIError) as info:
        asyncio.run(svc.detokenize(parse_request(DetokenizeRequest, {"model": "nope", "tokens": [1]})))
    assert info.value.status == 404


def test_detokenize(spec):
    svc = TokenService([spec], FakeTokens())
    body = asyncio.run(svc.detokenize(parse_request(DetokenizeRequest, {"model": MODEL, "tokens": [0, 1, 2]})))
    assert body == {"prompt": "abc"}


def test_the_logprob_budget_is_shared_over_the_prompts(spec, model):
    svc = CompletionService([spec], model.open_stream, limits=Limits(max_logprob_entries=1000))
    asyncio.run(svc.complete(request(prompt=["a", "b", "c", "d"], echo=True, logprobs=2, max_tokens=0)))
    assert [g.max_logprob_entries for g in model.opened] == [250] * 4
    model.opened.clear()
    asyncio.run(svc.complete(request(max_tokens=2)))
    assert [g.max_logprob_entries for g in model.opened] == [1000]


def test_chat_planning_gives_the_generation_the_whole_budget(spec):
    fmt = resolve_reply_format(spec.chat_template, spec.reasoning_parser, spec.tool_parser)
    req = parse_chat_request({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                              "top_logprobs": 3})
    assert plan_request(req, spec, fmt, Limits(max_logprob_entries=777)).gen.max_logprob_entries == 777


def test_more_prompts_than_the_model_queues_are_a_400_before_any_generation(service, model, spec):
    from app.engine.admission import WAITING_PER_SLOT

    most = WAITING_PER_SLOT * spec.n_seq_max
    with pytest.raises(APIError) as info:
        complete(service, prompt=["Hi"] * (most + 1))
    assert info.value.status == 400 and info.value.param == "prompt" and info.value.code == "too_many_prompts"
    assert f"at most {most}" in info.value.message and model.opened == []
    assert len(complete(service, prompt=["Hi"] * most)["choices"]) == most
