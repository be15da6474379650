"""InfillService (`/infill`) over fake model streams: llama-server's request read into one FIM generation, its reply
shaped as llama-server's /completion objects (whole, and streamed as partial objects ending with the whole one),
`response_fields`, the editors' stops (`n_indent`, `t_max_predict_ms`) closing the generation, and the limits on
`input_extra` (100k files refused fast); `suffix` on /v1/completions planned as the same FIM prompt."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from app.api.errors import APIError
from app.api.infill import InfillRequest, nested_fields
from app.api.schemas import CompletionRequest, parse_request
from app.completions import CompletionService
from app.completions.infill import EditorStops, InfillService, plan_infill
from app.config.app_args import Limits
from app.config.spec import ModelSpec
from app.engine.events import Finished, Started, Text
from app.engine.params import GenerationRequest, InfillPrompt

MODEL = "m"


@pytest.fixture
def spec() -> ModelSpec:
    return ModelSpec(id=MODEL, path="/nonexistent.gguf", n_ctx=512, n_seq_max=4, n_batch=64, n_threads=1,
                     n_threads_batch=1, n_gpu_layers=0, kv_unified=True, cpu_extra_buffers="auto",
                     startup_self_check=False, chat_template="", bos_token="", eos_token="",
                     reasoning_parser="auto", tool_parser="auto", default_max_tokens=None, max_tokens_limit=100,
                     stream_interval_ms=0, tool_continuation_rounds=0, tool_continuation_tokens=0,
                     owned_by="me", n_vocab=1000)


class FakeModel:
    """Started, one Text per piece, Finished; records each generation and whether its stream was closed."""

    def __init__(self, pieces: list[str], finish: str = "stop", stop: str | None = None) -> None:
        self.pieces, self.finish, self.stop = pieces, finish, stop
        self.opened: list[GenerationRequest] = []
        self.closed = 0

    async def __call__(self, model: str, gen: GenerationRequest):
        self.opened.append(gen)
        try:
            yield [Started(prompt_tokens=20, cached_tokens=4)]
            for piece in self.pieces:
                yield [Text(piece, 1)]
            yield [Finished(self.finish, 20, len(self.pieces), 4, stop_sequence=self.stop,
                            token_ids=tuple(range(len(self.pieces))) if gen.return_tokens else ())]
        finally:
            self.closed += 1


def infill(**fields: Any) -> InfillRequest:
    return parse_request(InfillRequest, {"model": MODEL, "input_prefix": "def f():\n    ", "input_suffix": "\n",
                                         **fields})


def service(spec, model: FakeModel, **limits: Any) -> InfillService:
    return InfillService([spec], model, limits=Limits(**limits))


def test_the_request_becomes_one_fim_generation(spec):
    req = infill(input_extra=[{"filename": "a.py", "text": "x = 1"}, {"text": "y"}], prompt="return",
                 n_predict=12, temperature=0, samplers=["top_k", "top_p", "infill"], stop=["\n\n"], cache_prompt=False)
    gen = plan_infill(req, spec, Limits()).gen
    assert gen.prompt == "" and gen.infill == InfillPrompt("def f():\n    ", "\n", (("a.py", "x = 1"), ("tmp", "y")),
                                                           "return")
    assert gen.max_tokens == 12 and gen.stop == ["\n\n"] and gen.sampling.temperature == 0
    assert gen.sampling.infill and not gen.cache_prompt
    assert plan_infill(infill(n_predict=-1), spec, Limits()).gen.max_tokens is None  # llama-server's "no limit"
    with pytest.raises(APIError) as info:
        plan_infill(infill(n_predict=101), spec, Limits())
    assert info.value.param == "n_predict" and info.value.code == "max_tokens_exceeded"


def test_the_whole_reply_is_llama_servers_completion_object(spec):
    model = FakeModel(["a", " + b", "\n"])
    body = asyncio.run(service(spec, model).complete(infill(return_tokens=True)))
    assert body["content"] == "a + b\n" and body["stop"] is True and body["stop_type"] == "eos"
    assert body["tokens_predicted"] == 3 and body["tokens_evaluated"] == 20 and body["tokens_cached"] == 4
    assert body["tokens"] == [0, 1, 2] and body["has_new_line"] is True and body["truncated"] is False
    assert body["model"] == MODEL and body["stopping_word"] == ""
    timings = body["timings"]
    assert timings["prompt_n"] == 16 and timings["cache_n"] == 4 and timings["predicted_n"] == 3
    assert all(v >= 0 for v in timings.values())
    word = asyncio.run(service(spec, FakeModel(["a"], stop="\n\n")).complete(infill()))
    assert word["stop_type"] == "word" and word["stopping_word"] == "\n\n"
    assert asyncio.run(service(spec, FakeModel(["a"], finish="length")).complete(infill()))["stop_type"] == "limit"


def test_response_fields_pick_paths_as_llama_server_does(spec):
    body = asyncio.run(service(spec, FakeModel(["x"])).complete(
        infill(response_fields=["content", "timings/prompt_n", "timings/nope", ""])))
    assert body == {"content": "x", "timings/prompt_n": 16}
    assert nested_fields(["a/b/c"], {"a": {"b": 1}}) == {}


def collect(stream) -> list[dict[str, Any]]:
    async def run():
        return [chunk async for batch in stream for chunk in batch]
    return asyncio.run(run())


def test_a_stream_sends_partial_objects_then_the_whole_one(spec):
    chunks = collect(service(spec, FakeModel(["a", "b"])).stream(infill(stream=True)))
    assert [c["content"] for c in chunks] == ["a", "b", ""]
    assert [c["stop"] for c in chunks] == [False, False, True]
    assert chunks[1]["tokens_predicted"] == 2 and chunks[-1]["tokens_predicted"] == 2
    assert chunks[-1]["stop_type"] == "eos"


def test_n_indent_ends_the_completion_at_a_line_indented_less(spec):
    model = FakeModel(["    x = 1\n", "    y = 2\n", "z = 3\n", "more\n"])
    body = asyncio.run(service(spec, model).complete(infill(n_indent=4)))
    assert body["content"] == "    x = 1\n    y = 2\n" and body["stop_type"] == "limit"
    assert body["tokens_predicted"] == 3  # the tokens generated until the stop
    assert model.closed == 1  # the generation was closed there: its slot is freed
    streamed = collect(service(spec, FakeModel(["    a\n", "b", "c"])).stream(infill(n_indent=2, stream=True)))
    assert "".join(c["content"] for c in streamed) == "    a\n" and streamed[-1]["stop_type"] == "limit"


def test_editor_stops_follow_llama_servers_rules():
    stops = EditorStops(n_indent=2, t_max_predict_ms=None)
    assert stops.feed("first line at any indent\n") == ("first line at any indent\n", False)
    assert stops.feed("  ok\n \t") == ("  ok\n \t", False)
    assert stops.feed("x") == ("x", False)  # indented by a space and a tab: 2, enough
    empty = EditorStops(n_indent=1, t_max_predict_ms=None)
    assert empty.feed("a\n\n") == ("a\n", True)  # an empty line is indented less, as llama-server counts it
    timed = EditorStops(n_indent=0, t_max_predict_ms=1)
    assert timed.feed("a\n") == ("a\n", False)
    time.sleep(0.01)
    assert timed.feed("b") == ("b", True)  # a new line seen, and the time is up


def test_input_extra_is_bounded_and_a_flood_is_refused_fast(spec):
    with pytest.raises(APIError) as info:
        plan_infill(infill(input_extra=[{"text": "x"}] * 3), spec, Limits(max_infill_extra=2))
    assert info.value.param == "input_extra" and info.value.code == "too_many_inputs"
    body = {"model": MODEL, "input_prefix": "", "input_suffix": "", "input_extra": [{"text": ""}] * 100_000}
    started = time.perf_counter()
    with pytest.raises(APIError):
        plan_infill(parse_request(InfillRequest, body), spec, Limits())
    assert time.perf_counter() - started < 2.0  # read once, linear; refused before any tokenizing


@pytest.mark.parametrize("body, param", [
    ({"input_prefix": 1, "input_suffix": ""}, "input_prefix"),
    ({"input_suffix": ""}, "input_prefix"),
    ({"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "a"}]}, "input_extra[0]"),
    ({"input_prefix": "", "input_suffix": "", "input_extra": [{"text": "a", "filename": 3}]}, "input_extra[0].filename"),
    ({"input_prefix": "", "input_suffix": "", "input_extra": {"text": "a"}}, "input_extra"),
    ({"input_prefix": "", "input_suffix": "", "n_predict": -2}, "n_predict"),
    ({"input_prefix": "", "input_suffix": "", "temperature": 3}, "temperature"),
])
def test_malformed_bodies_are_400s_naming_the_field(body, param):
    with pytest.raises(APIError) as info:
        parse_request(InfillRequest, {"model": MODEL, **body})
    assert info.value.status == 400 and info.value.param == param


def test_suffix_on_the_legacy_route_is_the_same_fim_prompt(spec):
    model = FakeModel(["x"], finish="length")
    svc = CompletionService([spec], model)
    req = parse_request(CompletionRequest, {"model": MODEL, "prompt": ["def f():", "g = "], "suffix": "\nreturn",
                                            "max_tokens": 4})
    body = asyncio.run(svc.complete(req))
    assert [g.infill for g in model.opened] == [InfillPrompt("def f():", "\nreturn"), InfillPrompt("g = ", "\nreturn")]
    assert all(g.prompt == "" for g in model.opened) and [c["text"] for c in body["choices"]] == ["x", "x"]
    with pytest.raises(APIError) as info:
        parse_request(CompletionRequest, {"model": MODEL, "prompt": "a", "suffix": "b", "echo": True})
    assert info.value.param == "echo"
