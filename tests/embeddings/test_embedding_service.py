"""The embeddings service without a model: `input` in its four forms, the refusals that name the field or
element at fault, `dimensions`, the wrong kind of model, and the body in float and base64."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest

from app.api.embeddings import EmbeddingRequest
from app.api.errors import APIError
from app.api.schemas import parse_request
from app.config.app_args import Limits
from app.config.spec import ModelSpec
from app.embeddings import EmbeddingService
from app.engine.params import EmbeddingJob, EmbeddingResult


def spec(kind: str = "embedding", mid: str = "emb") -> ModelSpec:
    return ModelSpec(id=mid, path="", n_ctx=512, n_seq_max=4, n_batch=512, n_threads=1, n_threads_batch=1,
                     n_gpu_layers=0, kv_unified=False, cpu_extra_buffers="auto", startup_self_check=False,
                     chat_template="", bos_token="", eos_token="", reasoning_parser="auto", tool_parser="auto",
                     default_max_tokens=None, max_tokens_limit=None, stream_interval_ms=0,
                     tool_continuation_rounds=0, tool_continuation_tokens=1, owned_by="t", kind=kind,
                     pooling="mean" if kind == "embedding" else "", n_embd=4, dimensions=(2,) if kind == "embedding" else ())


class FakeModels:
    """Vectors made from the inputs' index, so the body's order and values can be checked."""

    def __init__(self) -> None:
        self.jobs: list[EmbeddingJob] = []

    async def run(self, model_id: str, job: EmbeddingJob) -> EmbeddingResult:
        self.jobs.append(job)
        dims = job.dimensions or 4
        vectors = tuple(np.arange(dims, dtype=np.float32) / 7 + i for i in range(len(job.inputs)))
        return EmbeddingResult(vectors, prompt_tokens=3 * len(job.inputs))


def run(service: EmbeddingService, **body):
    req = parse_request(EmbeddingRequest, {"model": "emb", **body})
    return asyncio.run(service.complete(req))


@pytest.fixture
def models():
    return FakeModels()


@pytest.fixture
def service(models):
    return EmbeddingService([spec(), spec("chat", "chat")], models, Limits(max_embedding_inputs=3))


@pytest.mark.parametrize("given,inputs,single", [
    ("hello", ("hello",), True),
    (["a", "b"], ("a", "b"), False),
    ([1, 2, 3], ((1, 2, 3),), True),
    ([[1, 2], [3]], ((1, 2), (3,)), False),
])
def test_each_input_form(service, models, given, inputs, single):
    body = run(service, input=given)
    assert models.jobs[-1].inputs == inputs and models.jobs[-1].single == single
    assert [d["index"] for d in body["data"]] == list(range(len(inputs)))
    assert body["object"] == "list" and body["model"] == "emb"
    assert body["usage"] == {"prompt_tokens": 3 * len(inputs), "total_tokens": 3 * len(inputs)}


def test_base64_is_the_float32_little_endian_of_the_floats(service):
    floats = run(service, input=["a", "b"])["data"]
    encoded = run(service, input=["a", "b"], encoding_format="base64")["data"]
    for f, e in zip(floats, encoded):
        assert isinstance(e["embedding"], str)
        decoded = np.frombuffer(base64.b64decode(e["embedding"]), dtype="<f4")
        assert decoded.tolist() == f["embedding"]


@pytest.mark.parametrize("given,param", [
    ("", "input"), ([], "input"), (["a", ""], "input[1]"), ([[1], []], "input[1]"), (["a", 1], "input[1]"),
    ([[1], "a"], "input[1]"), ([True], "input[0]"), ({"a": 1}, "input"), (["a", "b", "c", "d"], "input"),
])
def test_bad_inputs_name_their_place(service, models, given, param):
    with pytest.raises(APIError) as err:
        run(service, input=given)
    assert err.value.status == 400 and err.value.param == param
    assert not models.jobs  # nothing reached the model


def test_dimensions_only_where_the_model_lists_them(service, models):
    assert len(run(service, input="a", dimensions=2)["data"][0]["embedding"]) == 2
    assert models.jobs[-1].dimensions == 2
    run(service, input="a", dimensions=4)  # the whole vector: nothing to cut
    assert models.jobs[-1].dimensions is None
    with pytest.raises(APIError) as err:
        run(service, input="a", dimensions=3)
    assert err.value.param == "dimensions" and "2" in err.value.message


@pytest.mark.parametrize("body,param", [({"encoding_format": "hex"}, "encoding_format"),
                                        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
                                        ({"dimensions": 0}, "dimensions")])
def test_bad_fields(service, body, param):
    with pytest.raises(APIError) as err:
        run(service, input="a", **body)
    assert err.value.param == param


def test_a_chat_model_serves_no_embeddings(service, models):
    req = parse_request(EmbeddingRequest, {"model": "chat", "input": "a"})
    with pytest.raises(APIError) as err:
        asyncio.run(service.complete(req))
    assert err.value.status == 400 and err.value.param == "model"
    assert "chat model" in err.value.message and "/v1/embeddings" in err.value.message


def test_limits_reach_the_job(service, models):
    run(service, input=["a"], truncate_prompt_tokens=-1)
    assert models.jobs[-1].truncate == -1 and models.jobs[-1].max_total_tokens == Limits().max_embedding_tokens


@pytest.mark.parametrize("protocol", ["chat", "completions"])
def test_an_embedding_model_generates_nothing(protocol):
    from app.api.schemas import ChatCompletionRequest, CompletionRequest
    from app.chat import ChatService
    from app.completions import CompletionService

    async def never(model_id, request):  # pragma: no cover - planning refuses first
        raise AssertionError("reached the model")
        yield

    if protocol == "chat":
        svc = ChatService([spec()], never)
        req = parse_request(ChatCompletionRequest, {"model": "emb", "messages": [{"role": "user", "content": "hi"}]})
    else:
        svc = CompletionService([spec()], never)
        req = parse_request(CompletionRequest, {"model": "emb", "prompt": "hi"})
    with pytest.raises(APIError) as err:
        asyncio.run(svc.complete(req))
    assert err.value.status == 400 and err.value.param == "model"
    assert "embedding model" in err.value.message and "/v1/embeddings" in err.value.message


class Records:
    def __init__(self) -> None:
        self.records = []

    def record(self, rec) -> None:
        self.records.append(rec)


def test_each_answered_or_failed_request_is_recorded_once(models):
    from app.api.errors import APIError

    records = Records()
    service = EmbeddingService([spec()], models, Limits(), records)
    run(service, input=["a", "b"])
    (rec,) = records.records
    assert (rec.protocol, rec.status, rec.prompt_tokens, rec.completion_tokens, rec.stream) == \
        ("embeddings", "ok", 6, 0, False)

    async def broken(model_id, job):
        raise APIError("engine down", status=503, code="engine_unavailable")
    models.run = broken
    with pytest.raises(APIError):
        run(service, input="a")
    assert (records.records[-1].status, records.records[-1].error_code) == ("error", "engine_unavailable")
    with pytest.raises(APIError):  # the client's own error: refused before the model, not recorded
        run(service, input="")
    assert len(records.records) == 2
