"""/api/embed and Ollama's older /api/embeddings over the embeddings service (app/embeddings/): the request as
OpenAI's embeddings request (`truncate`, default true, as vLLM's `truncate_prompt_tokens: -1`: an input longer
than the context keeps its last tokens; `truncate: false` makes it a 400), the same job on the model's engine, the
vectors as Ollama's body. No input at all only loads the model (`keep_alive`), as Ollama answers it. `options` are
checked as for a generation (a sampling option changes nothing in an embedding; `num_ctx` past the model's context
is a 400)."""

from __future__ import annotations

import time
from typing import Any

from ..api.embeddings import EmbeddingRequest
from ..api.errors import served_model
from ..config.app_args import Limits
from ..config.spec import ModelSpec
from ..embeddings.service import EmbeddingService, ModelEmbeddings
from ..generation.caller import ANONYMOUS, Caller
from ..generation.lifecycle import pooled_request
from ..observe.request_records import NullObserver, RequestObserver
from ..pools.admin import PoolAdmin
from .keep_alive import KeepAlive
from .options import check_num_ctx, keep_alive_seconds, read_options
from .schemas import OllamaEmbeddingsRequest, OllamaEmbedRequest
from .names import resolved


class OllamaEmbedService:
    protocol = "ollama_embed"

    def __init__(self, specs: list[ModelSpec], models: ModelEmbeddings, limits: Limits | None = None,
                 observer: RequestObserver | None = None, pools: PoolAdmin | None = None) -> None:
        self.models = {s.id: s for s in specs}
        self.limits = limits or Limits()
        self.observer = observer or NullObserver()
        self.engines = models
        self.embeddings = EmbeddingService(specs, models, self.limits, self.observer)
        self.keep_alive = KeepAlive(pools)

    async def _vectors(self, req: OllamaEmbedRequest | OllamaEmbeddingsRequest, inputs: list[str],
                       truncate: bool, dimensions: int | None, caller: Caller) -> tuple[list[list[float]], int, float]:
        """(vectors, prompt tokens, seconds) of `inputs`; none: the model loaded only."""
        received = time.monotonic()
        seconds = keep_alive_seconds(req.keep_alive)
        spec = served_model(self.models, req.model, "embedding", "/api/embed", caller.policy)
        check_num_ctx(read_options(req.options), spec)
        if not inputs:
            await self.keep_alive.load_only(spec, seconds, caller)
            return [], 0, time.monotonic() - received
        mapped = EmbeddingRequest(model=req.model, input=inputs, dimensions=dimensions,
                                  truncate_prompt_tokens=-1 if truncate else None)
        job = self.embeddings.job(mapped, caller)  # the client's errors, before anything is recorded
        await self.keep_alive.before(spec, seconds, caller)
        result = await pooled_request(self.observer, self.protocol, req.model, self.limits,
                                      lambda: self.engines.run(req.model, job), caller)
        await self.keep_alive.after(spec, seconds, caller)
        return [v.tolist() for v in result.vectors], result.prompt_tokens, time.monotonic() - received

    async def embed(self, req: OllamaEmbedRequest, caller: Caller = ANONYMOUS) -> dict[str, Any]:
        req = resolved(self.models, req, caller)
        inputs = [req.input] if isinstance(req.input, str) else list(req.input)
        vectors, tokens, seconds = await self._vectors(req, inputs if any(inputs) else [], req.truncate, req.dimensions,
                                                       caller)
        return {"model": req.name, "embeddings": vectors, "total_duration": int(seconds * 1e9), "load_duration": 0,
                "prompt_eval_count": tokens}

    async def legacy(self, req: OllamaEmbeddingsRequest, caller: Caller = ANONYMOUS) -> dict[str, Any]:
        req = resolved(self.models, req, caller)
        vectors, _, _ = await self._vectors(req, [req.prompt] if req.prompt else [], True, None, caller)
        return {"embedding": vectors[0] if vectors else []}
