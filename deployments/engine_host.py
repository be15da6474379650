"""One model's llama.cpp engine inside a Ray replica: a LlamaModel replica's (`llama_model: deployment`),
or the Ingress replica's own (`llama_model: ingress`, no Ray hop between the HTTP server and the engine)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import ray

from app.api.errors import overloaded, service_unavailable, wrong_kind
from app.config.spec import ModelSpec, place
from app.engine import GenerationRequest
from app.engine.admission import WAITING_PER_SLOT
from app.engine.embedder import embed
from app.engine.events import Event, Started
from app.engine.factory import start_engine
from app.engine.jobs import CountPromptJob, DetokenizeJob, InfillTokensJob, StatsJob, TokenizeJob
from app.engine.params import EmbeddingJob, EmbeddingResult, Job, RerankJob, RerankResult
from app.engine.protocol import Engine
from app.engine.selfcheck import EngineUnavailable
from app.engine.stream import generate_stream
from app.engine.timeline import Timeline
from app.replica.local_copy import needs_fetch
from app.replica.preparation import Preparation
from app.observe import tracing
from app.serving.models import LOADING, READY, ModelState
from app.tenants.prep_pool import PREPARATION

from .metrics import EngineGauges

logger = logging.getLogger("ray.serve")
R = TypeVar("R")


class EngineHost:
    def __init__(self, spec: ModelSpec, on_change: Callable[[], None] = lambda: None) -> None:
        """`on_change`: called (from another thread) when the state changes after the constructor returned:
        a download's end, the engine's start after it."""
        # The auto values (threads, GPU layers) are decided here, from what Ray gave this replica.
        assigned = ray.get_runtime_context().get_assigned_resources()
        self.spec = place(spec, cpus=assigned.get("CPU"), gpus=len(ray.get_gpu_ids()))
        logger.info("model %r: n_threads %d, n_threads_batch %d, n_gpu_layers %d (reserved for this replica: %s)",
                    spec.id, self.spec.n_threads, self.spec.n_threads_batch, self.spec.n_gpu_layers, assigned)
        # A model llama.cpp cannot run here, or whose file cannot be fetched, leaves the replica up, saying
        # why (/health, errors, log), instead of a crash that Serve would restart forever.
        self.engine: Engine | None = None
        self.unavailable: str | None = None
        # Adapters of the spec that could not be loaded, with why: their requests get a 503 saying so, while
        # the base model and the other adapters serve.
        self.adapter_errors: dict[str, str] = {}
        # A remote model (or one with a checksum) is fetched in the background: the constructor returns at
        # once and Serve's health checks pass while it downloads; the engine starts when it is here.
        self.preparation = (Preparation(self.spec, self._start_engine, on_change=on_change)
                            if needs_fetch(self.spec) else None)
        if self.preparation is None:
            self._start_engine(self.spec)
        self.gauges = EngineGauges(self.spec.id)
        self._gauge_task: asyncio.Task | None = None
        # Requests through `generate` not yet started: being prepared (off the event loop) or waiting for
        # a slot. The engine's own queue does not see the ones still being prepared.
        self._unstarted = 0

    def _start_engine(self, spec: ModelSpec) -> None:
        self.spec = spec
        try:
            engine = start_engine(spec)
        except EngineUnavailable as exc:
            self.unavailable = str(exc)
            logger.error("%s", exc)
            return
        self.adapter_errors = load_adapters(engine, spec)
        self.engine = engine  # requests find it only with its adapters loaded

    async def _publish_gauges(self) -> None:
        while self.engine is None and self.unavailable is None:  # still fetching or starting
            await asyncio.sleep(1.0)
        while self.engine is not None:
            self.gauges.update(self.engine.stats())
            await asyncio.sleep(1.0)

    def _ready_engine(self):
        if self.engine is None:
            if self.unavailable is not None:
                raise service_unavailable(self.unavailable, code="engine_unavailable")
            state = self.state()
            code = {"failed": "model_fetch_failed", "downloading": "model_downloading"}.get(state.state, "model_loading")
            raise service_unavailable(state.reason or f"model {self.spec.id!r} is starting; retry shortly", code=code)
        return self.engine

    async def generate(self, request: GenerationRequest, *, bounded: bool = False) -> AsyncIterator[list[Event]]:
        """The request's event batches. `bounded`: refuse it (503) when WAITING_PER_SLOT requests per slot
        already wait, for a caller with no Serve queue of its own in front."""
        if self._gauge_task is None:  # needs the replica's event loop, so not in __init__
            self._gauge_task = asyncio.get_running_loop().create_task(self._publish_gauges())
        engine = self._ready_engine()
        if self.spec.kind != "chat":
            raise wrong_kind(self.spec.id, self.spec.kind, "generation")
        for name, _ in request.adapters:
            if name in self.adapter_errors:
                raise service_unavailable(self.adapter_errors[name], code="adapter_unavailable")
        if bounded and self._unstarted >= WAITING_PER_SLOT * self.spec.n_seq_max:
            raise overloaded()
        self._unstarted += 1
        started, timeline, failure = False, Timeline(), None
        try:
            async for batch in generate_stream(engine, request, self.spec.stream_interval_ms / 1000):
                if not started:
                    started = True
                    self._unstarted -= 1
                timeline.feed(batch)
                if batch and isinstance(batch[0], Started) and batch[0].cached_tokens > 0:
                    self.gauges.cache_hit()
                yield batch
        except BaseException as exc:
            failure = exc
            raise
        finally:
            if not started:
                self._unstarted -= 1
            timeline.close(failure)
            self.gauges.record(timeline)
            if tracing.current().enabled:
                tracing.record_generation(timeline, request, self.spec.id, failure)

    async def run(self, job: Job[R], *, bounded: bool = False) -> R:
        """What `job` asks of this model, answered by its type's handler (JOB_HANDLERS).
        `bounded`: as `generate`, for the jobs that queue for the engine's slots (embeddings, scores)."""
        handler = JOB_HANDLERS.get(type(job))
        if handler is None:
            raise TypeError(f"a model's host has no handler for {type(job).__name__}")
        return await handler(self, job, bounded)

    async def _pooled(self, job: EmbeddingJob | RerankJob, bounded: bool) -> EmbeddingResult | RerankResult:
        """An embedding model's vectors for the job's inputs, or a reranker's scores for a RerankJob's pairs
        (batched with other requests' by its engine)."""
        engine = self._ready_engine()
        kind = self.spec.kind
        if kind != ("rerank" if isinstance(job, RerankJob) else "embedding"):
            raise wrong_kind(self.spec.id, kind, "/v1/rerank" if isinstance(job, RerankJob) else "/v1/embeddings")
        if bounded and self._unstarted >= WAITING_PER_SLOT * self.spec.n_seq_max:
            raise overloaded()
        self._unstarted += 1
        try:
            return await embed(engine, job)
        finally:
            self._unstarted -= 1

    async def _tokenize(self, job: TokenizeJob, bounded: bool) -> list[int]:
        return await PREPARATION.run("", self._ready_engine().tokenize, job.text, job.add_special)

    async def _count_prompt(self, job: CountPromptJob, bounded: bool) -> int:
        engine = self._ready_engine()
        if self.spec.kind != "chat":
            raise wrong_kind(self.spec.id, self.spec.kind, "chat prompts")
        return await PREPARATION.run("", engine.count_prompt, job.prompt, job.images)

    async def _infill_tokens(self, job: InfillTokensJob, bounded: bool) -> list[int]:
        engine = self._ready_engine()
        if self.spec.kind != "chat":
            raise wrong_kind(self.spec.id, self.spec.kind, "fill-in-the-middle prompts")
        return await PREPARATION.run("", engine.infill_tokens, job.infill, job.max_tokens)

    async def _detokenize(self, job: DetokenizeJob, bounded: bool) -> str:
        return await PREPARATION.run("", self._ready_engine().detokenize, job.tokens)

    async def _stats(self, job: StatsJob, bounded: bool) -> dict[str, Any]:
        return self.stats()

    def stats(self) -> dict[str, Any]:
        if self.engine is None:
            return {"model": self.spec.id, "pid": os.getpid(), "healthy": False,
                    "error": self.unavailable or self.state().reason}
        return {"model": self.spec.id, "pid": os.getpid(), **self.engine.stats()}

    def state(self) -> ModelState:
        """Whether this engine serves, without taking its lock (read by /health)."""
        if self.engine is None:
            if self.unavailable is not None:
                return ModelState("unavailable", self.unavailable)
            fetching = self.preparation.state() if self.preparation is not None else None
            return fetching or LOADING
        if not self.engine.healthy():
            return ModelState("unavailable", f"the llama.cpp engine stopped: {self.engine.broken}")
        return READY

    def info(self) -> dict[str, Any]:
        """Facts about this replica's engine: threads, GPU layers, and the bytes it downloaded itself (0 when
        the node's cache had the file: another replica fetched it)."""
        fetched = self.preparation.progress.done if self.preparation is not None else 0
        return {"n_threads": self.spec.n_threads, "n_gpu_layers": self.spec.n_gpu_layers, "path": self.spec.path,
                "downloaded_bytes": fetched}

    def check_health(self) -> None:
        # An unavailable engine, or a failed download, is a condition a restart would not fix (the
        # preparation tries a download again itself when another try may help), not a replica fault.
        if self.preparation is not None:
            self.preparation.maybe_retry()
        if self.engine is not None and not self.engine.healthy():
            raise RuntimeError(f"llama.cpp engine for {self.spec.id} is unhealthy: {self.engine.broken}")

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


# Each job type's handler: a new job is a type (app/engine/jobs.py) and one line here; the classes that
# forward `run` (LocalModels, RemoteModels, LlamaModel, the pool) never change for it.
JOB_HANDLERS: dict[type, Callable[[EngineHost, Any, bool], Awaitable[Any]]] = {
    EmbeddingJob: EngineHost._pooled,
    RerankJob: EngineHost._pooled,
    TokenizeJob: EngineHost._tokenize,
    DetokenizeJob: EngineHost._detokenize,
    CountPromptJob: EngineHost._count_prompt,
    InfillTokensJob: EngineHost._infill_tokens,
    StatsJob: EngineHost._stats,
}


def load_adapters(engine: Any, spec: ModelSpec) -> dict[str, str]:
    """Load the spec's LoRA adapters into a started engine (in the constructor or the fetch thread: off the
    event loop); {name: why} for those that could not be loaded (the builder checked local ones against the
    model, so this is a remote one made for another base, or a file llama.cpp refused)."""
    errors: dict[str, str] = {}
    for adapter in spec.adapters:
        try:
            engine.load_adapter(adapter.name, adapter.path)
        except (ValueError, RuntimeError, OSError) as exc:  # AdapterMismatch is a ValueError
            errors[adapter.name] = f"adapter `{adapter.name}` of model `{spec.id}` could not be loaded: {exc}"
            logger.error("%s", errors[adapter.name])
    return errors

