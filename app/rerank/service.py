"""RerankService: a rerank request checked against its model and the server's limits, sent to the reranker's
engine as one RerankJob (each (query, document) pair a sequence, batched with other requests' inputs), and
its scores shaped as llama-server's and vLLM's body: results sorted by relevance_score, highest first."""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from ..api.errors import invalid_request, served_model
from ..api.rerank import RerankRequest, documents
from ..config.app_args import Limits
from ..config.spec import ModelSpec
from ..engine.params import RerankJob, RerankResult
from ..observe.request_records import NullObserver, RequestObserver
from ..generation.caller import ANONYMOUS, Caller
from ..generation.lifecycle import pooled_request


class ModelReranker(Protocol):
    async def run(self, model_id: str, job: RerankJob) -> RerankResult: ...


def rerank_body(request_id: str, model: str, texts: tuple[str, ...], result: RerankResult, top_n: int | None,
                return_documents: bool) -> dict[str, Any]:
    order = sorted(range(len(texts)), key=lambda i: result.scores[i], reverse=True)[:top_n]
    results = []
    for i in order:
        item: dict[str, Any] = {"index": i, "relevance_score": result.scores[i]}
        if return_documents:
            item["document"] = {"text": texts[i]}
        results.append(item)
    return {"id": request_id, "model": model, "results": results,
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}}


class RerankService:
    protocol = "rerank"

    def __init__(self, specs: list[ModelSpec], models: ModelReranker, limits: Limits | None = None,
                 observer: RequestObserver | None = None) -> None:
        self.models = {s.id: s for s in specs}
        self.engines = models
        self.limits = limits or Limits()
        self.observer = observer or NullObserver()

    def job(self, req: RerankRequest, caller: Caller = ANONYMOUS) -> RerankJob:
        """The request as its reranker's engine takes it; a 400 for what can be told without the tokenizer."""
        served_model(self.models, req.model, "rerank", "/v1/rerank", caller.policy)
        if not req.query:
            raise invalid_request("`query` is an empty string.", param="query", code="empty_input")
        texts = documents(req.documents, self.limits.max_rerank_documents)
        return RerankJob(request_id=f"rerank-{uuid.uuid4().hex}", query=req.query, documents=texts,
                         truncate=req.truncate_prompt_tokens, max_total_tokens=self.limits.max_rerank_tokens)

    async def complete(self, req: RerankRequest, caller: Caller = ANONYMOUS) -> dict[str, Any]:
        job = self.job(req, caller)
        result = await pooled_request(self.observer, self.protocol, req.model, self.limits,
                                      lambda: self.engines.run(req.model, job), caller)
        return rerank_body(job.request_id, req.model, job.documents, result, req.top_n, req.return_documents)
