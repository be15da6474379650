"""One pooled model as an engine host: the two calls a model's host answers (`generate`, `run`), each holding
the model in its pool for as long as it runs (loading it first when it is cold). The pool's deployment and the
single-shape Ingress serve a pooled model through it as they serve any other."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ..engine.jobs import StatsJob
from .admin import PoolJob, answer_pool_job
from .manager import PoolManager


class PooledHost:
    def __init__(self, pool: PoolManager, model_id: str) -> None:
        self.pool = pool
        self.model_id = model_id

    async def generate(self, request: Any, *, bounded: bool = False) -> AsyncIterator[Any]:
        # A batch line (GenerationRequest.batch) loads its model only into room, never evicting another.
        async with self.pool.use(self.model_id, evict=not getattr(request, "batch", False)) as host:
            async for batch in host.generate(request, bounded=bounded):
                yield batch

    async def run(self, job: Any, *, bounded: bool = False) -> Any:
        if isinstance(job, StatsJob):  # what the pool holds of it: asking must not load a cold model
            return self.stats()
        if isinstance(job, PoolJob):  # an operator's load, unload, pin (the admin routes)
            return await answer_pool_job(self.pool, self.model_id, job)
        async with self.pool.use(self.model_id) as host:
            return await host.run(job, bounded=bounded)

    def stats(self) -> dict[str, Any]:
        host = self.pool.loaded().get(self.model_id)
        pooled = {"pool": self.pool.plan.name, "pool_state": self.pool.state(self.model_id)}
        return {**host.stats(), **pooled} if host is not None else {"model": self.model_id, **pooled}

    def info(self) -> dict[str, Any]:
        host = self.pool.loaded().get(self.model_id)
        return {"pool": self.pool.plan.name, **(host.info() if host is not None else {})}

    def check_health(self) -> None:
        host = self.pool.loaded().get(self.model_id)
        if host is not None:
            host.check_health()

    def close(self) -> None:
        pass  # the pool's models are its own: PoolManager.close
