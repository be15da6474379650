"""The rerank service without a model: documents as strings or {"text"} objects, the refusals that name the
field or document at fault, the wrong kind of model, and the body: sorted by score, top_n, return_documents."""

from __future__ import annotations

import asyncio

import pytest

from app.api.errors import APIError
from app.api.rerank import RerankRequest
from app.api.schemas import parse_request
from app.config.app_args import Limits
from app.config.spec import ModelSpec
from app.engine.params import RerankJob, RerankResult
from app.rerank import RerankService


def spec(kind: str, mid: str) -> ModelSpec:
    return ModelSpec(id=mid, path="", n_ctx=512, n_seq_max=4, n_batch=512, n_threads=1, n_threads_batch=1,
                     n_gpu_layers=0, kv_unified=False, cpu_extra_buffers="auto", startup_self_check=False,
                     chat_template="", bos_token="", eos_token="", reasoning_parser="auto", tool_parser="auto",
                     default_max_tokens=None, max_tokens_limit=None, stream_interval_ms=0,
                     tool_continuation_rounds=0, tool_continuation_tokens=1, owned_by="t", kind=kind,
                     pooling={"rerank": "rank", "embedding": "mean"}.get(kind, ""))


class FakeModels:
    """Scores read from the documents (`"0.5 ..."` scores 0.5), so order and values can be checked."""

    def __init__(self) -> None:
        self.jobs: list[RerankJob] = []

    async def run(self, model_id: str, job: RerankJob) -> RerankResult:
        self.jobs.append(job)
        return RerankResult(tuple(float(d.split()[0]) for d in job.documents), prompt_tokens=7 * len(job.documents))


def service(**limits) -> tuple[RerankService, FakeModels]:
    models = FakeModels()
    specs = [spec("rerank", "rr"), spec("embedding", "emb"), spec("chat", "chat")]
    return RerankService(specs, models, Limits(**limits)), models


def answer(body: dict, **limits) -> dict:
    svc, _ = service(**limits)
    return asyncio.run(svc.complete(parse_request(RerankRequest, {"model": "rr", "query": "q", **body})))


def refusal(body: dict, **limits) -> APIError:
    with pytest.raises(APIError) as err:
        answer(body, **limits)
    assert err.value.status == 400
    return err.value


def test_results_are_sorted_by_score_with_their_index_and_usage():
    body = answer({"documents": ["0.1 a", "0.9 b", {"text": "0.5 c"}]})
    assert [(r["index"], r["relevance_score"]) for r in body["results"]] == [(1, 0.9), (2, 0.5), (0, 0.1)]
    assert all("document" not in r for r in body["results"])
    assert body["model"] == "rr" and body["id"].startswith("rerank-")
    assert body["usage"] == {"prompt_tokens": 21, "total_tokens": 21}


def test_top_n_and_return_documents():
    body = answer({"documents": ["0.1 a", "0.9 b", "0.5 c"], "top_n": 2, "return_documents": True})
    assert [(r["index"], r["document"]) for r in body["results"]] == [(1, {"text": "0.9 b"}), (2, {"text": "0.5 c"})]
    assert len(answer({"documents": ["0.1 a"], "top_n": 5})["results"]) == 1


def test_refusals_name_the_field_or_document():
    assert refusal({"documents": []}).param == "documents"
    assert refusal({"documents": ["0.1 a", ""]}).param == "documents[1]"
    assert refusal({"documents": ["0.1 a", 3]}).param == "documents[1]"
    assert refusal({"documents": ["0.1 a", {"text": "x", "title": "y"}]}).param == "documents[1]"
    assert refusal({"documents": "0.1 a"}).param == "documents"
    assert refusal({"query": "", "documents": ["0.1 a"]}).param == "query"
    err = refusal({"documents": ["0.1 a"] * 3}, max_rerank_documents=2)
    assert err.param == "documents" and "max_rerank_documents" in err.message
    assert refusal({"documents": ["0.1 a"], "top_n": 0}).param == "top_n"


def test_a_chat_or_embedding_model_asked_to_rerank_is_the_wrong_kind():
    svc, models = service()
    for model in ("chat", "emb"):
        with pytest.raises(APIError) as err:
            svc.job(parse_request(RerankRequest, {"model": model, "query": "q", "documents": ["d"]}))
        assert err.value.code == "unsupported_model" and "/v1/rerank" in err.value.message
    assert not models.jobs


def test_the_job_carries_the_limits_and_truncation():
    svc, _ = service(max_rerank_tokens=99)
    job = svc.job(parse_request(RerankRequest, {"model": "rr", "query": "q", "documents": ["a"],
                                                "truncate_prompt_tokens": -1}))
    assert (job.query, job.documents, job.truncate, job.max_total_tokens) == ("q", ("a",), -1, 99)
