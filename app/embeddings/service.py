"""EmbeddingService: an embeddings request checked against its model and the server's limits, sent to the
model's engine as one EmbeddingJob (tokenized and batched there), and its vectors shaped as OpenAI's body:
floats, or base64 of little-endian float32 as OpenAI sends them (what its SDK asks for by default)."""

from __future__ import annotations

import base64
import uuid
from typing import Any, Protocol

import numpy as np

from ..api.embeddings import EmbeddingRequest, inputs
from ..api.errors import invalid_request, served_model
from ..config.app_args import Limits
from ..config.spec import ModelSpec
from ..engine.params import EmbeddingJob, EmbeddingResult
from ..observe.request_records import NullObserver, RequestObserver
from ..generation.caller import ANONYMOUS, Caller
from ..generation.lifecycle import pooled_request


class ModelEmbeddings(Protocol):
    async def run(self, model_id: str, job: EmbeddingJob) -> EmbeddingResult: ...


def encode(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector.tolist()


def embedding_body(model: str, result: EmbeddingResult, encoding_format: str) -> dict[str, Any]:
    data = [{"object": "embedding", "index": i, "embedding": encode(v, encoding_format)}
            for i, v in enumerate(result.vectors)]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}}


class EmbeddingService:
    protocol = "embeddings"

    def __init__(self, specs: list[ModelSpec], models: ModelEmbeddings, limits: Limits | None = None,
                 observer: RequestObserver | None = None) -> None:
        self.models = {s.id: s for s in specs}
        self.engines = models
        self.limits = limits or Limits()
        self.observer = observer or NullObserver()

    def job(self, req: EmbeddingRequest, caller: Caller = ANONYMOUS) -> EmbeddingJob:
        """The request as its model's engine takes it; a 400 for what can be told without the model's tokenizer."""
        spec = served_model(self.models, req.model, "embedding", "/v1/embeddings", caller.policy)
        items, single = inputs(req.input, self.limits.max_embedding_inputs)
        if req.dimensions is not None and req.dimensions != spec.n_embd and req.dimensions not in spec.dimensions:
            sizes = ", ".join(map(str, spec.dimensions))
            raise invalid_request(
                f"Model `{spec.id}` gives {spec.n_embd}-dimension vectors"
                + (f" and can shorten them to {sizes}" if sizes else " and cannot shorten them (its entry lists no "
                                                                    "`dimensions`)")
                + f"; `dimensions` {req.dimensions} is not one of those.", param="dimensions",
                code="unsupported_dimensions")
        dims = req.dimensions if req.dimensions is not None and req.dimensions != spec.n_embd else None
        return EmbeddingJob(request_id=f"embd-{uuid.uuid4().hex}", inputs=items, single=single,
                            truncate=req.truncate_prompt_tokens, dimensions=dims,
                            max_total_tokens=self.limits.max_embedding_tokens)

    async def complete(self, req: EmbeddingRequest, caller: Caller = ANONYMOUS) -> dict[str, Any]:
        job = self.job(req, caller)  # the client's errors, before anything is recorded (as for generations)
        result = await pooled_request(self.observer, self.protocol, req.model, self.limits,
                                      lambda: self.engines.run(req.model, job), caller)
        return embedding_body(req.model, result, req.encoding_format)
