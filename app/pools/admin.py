"""The admin routes over the pools (as llama-server's router mode has `/models/load` and `/models/unload`): load,
unload, pin and unpin a pooled model, and where each is loaded. Only admin keys may call them (the HTTP layer
checks; a server without keys answers its local user).

What crosses to a pool replica is a job (`LoadJob`, `UnloadJob`, `PinJob`, `PoolStatusJob`), carried by
`Models.run(model_id, job)` like any other and answered by the model's `PooledHost`. A job may name the replica
that must answer it (`replica`): a pool has several replicas (Serve's multiplexing puts a model on one or more),
so an unload or a pin is sent to each running replica by name, and a load to wherever Serve routes the model
(a replica that holds it when there is one: loading twice is a no-op). Which replicas run is the deployments'
business (`PoolReplicas`); in one process there is one, `local`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from ..api.errors import APIError, invalid_request, model_not_found
from ..config.spec import ModelSpec
from ..engine.params import Job
from ..tenants.access import may_use
from .manager import UNLOAD_WAIT_S, PoolManager

LOCAL = "local"
"""The one replica of a pool served in this process (topology `single`)."""

Holdings = dict[str, dict[str, Any]]
"""What one replica holds: model id -> {state (loaded, loading), pinned, active}."""


# ---- the jobs a pool replica answers (each answered with what the replica holds afterwards) -------------------

@dataclass(frozen=True)
class PoolJob(Job[Holdings]):
    """`replica`: the replica that must answer (None: wherever the model is routed). `loads`: whether it may load
    the model (only then does the replica take the model into Serve's routing table)."""

    replica: str | None = None
    loads: ClassVar[bool] = False


@dataclass(frozen=True)
class LoadJob(PoolJob):
    """Load the model (nothing to do when loaded); `pin`: and keep it (never evicted)."""

    pin: bool = False
    loads: ClassVar[bool] = True


@dataclass(frozen=True)
class UnloadJob(PoolJob):
    """Unload the model (and unpin it) once its requests end, waiting `wait_s` at most (else 409)."""

    wait_s: float = UNLOAD_WAIT_S


@dataclass(frozen=True)
class PinJob(PoolJob):
    """Pin the model where the replica holds it, or unpin it (LRU and idle unloading may take it again)."""

    pinned: bool = True


@dataclass(frozen=True)
class PoolStatusJob(PoolJob):
    """Only what the replica holds."""


async def answer_pool_job(pool: PoolManager, model_id: str, job: PoolJob) -> Holdings:
    """A replica's answer to a pool job for `model_id` (PooledHost.run)."""
    if isinstance(job, LoadJob):
        await pool.load(model_id, pin=job.pin)
    elif isinstance(job, UnloadJob):
        await pool.unload(model_id, job.wait_s)
    elif isinstance(job, PinJob):
        pool.set_pinned(model_id, job.pinned)
    return pool.describe()


# ---- the requests of the admin routes ----------------------------------------------------------------------

class _Admin(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class LoadModelRequest(_Admin):
    """`POST /admin/models/load`: load a pooled model now (200 when it already is)."""

    model: str = Field(min_length=1)


class UnloadModelRequest(_Admin):
    """`POST /admin/models/unload`: unload a pooled model from every replica that holds it (unpinning it)."""

    model: str = Field(min_length=1)


class PinModelRequest(_Admin):
    """`POST /admin/models/pin`: `pinned` true keeps the model loaded (loading it first when it is nowhere);
    false lets LRU and idle unloading take it again."""

    model: str = Field(min_length=1)
    pinned: bool = True


@dataclass(frozen=True)
class PoolModelsRequest:
    """`GET /admin/models`: every pooled model the key may use, with where it is loaded."""


PoolReplicas = Callable[[str], Awaitable[list[str]]]
"""A pool's running replicas, by name (the pool's name -> their ids)."""


async def local_replicas(pool: str) -> list[str]:
    return [LOCAL]


REPLICA_GONE = "replica_gone"
"""The code a job gets from a replica other than the one it names (the named one stopped meanwhile)."""


class PoolAdmin:
    """The admin routes' service: `run(model_id, job)` is the models' (Models.run), `replicas` the pools'."""

    def __init__(self, specs: list[ModelSpec], run: Callable[[str, Job[Any]], Awaitable[Any]],
                 replicas: PoolReplicas = local_replicas) -> None:
        self.specs = {s.id: s for s in specs}
        self.pools: dict[str, list[str]] = {}
        for spec in specs:
            if spec.pool:
                self.pools.setdefault(spec.pool, []).append(spec.id)
        self.run = run
        self.replicas = replicas

    def _pool_of(self, model_id: str, caller: Any) -> str:
        """The pool of `model_id`; a 404 for a model not configured or that the caller's key may not use (an admin
        key limited to some models loads, pins and unloads only those: tenants/access.py)."""
        spec = self.specs.get(model_id)
        if spec is None or not may_use(getattr(caller, "policy", None), model_id):
            raise model_not_found(model_id)
        if not spec.pool:
            raise invalid_request(f"Model `{model_id}` is not in a pool: it has a deployment of its own and is always "
                                  "loaded. Only pooled models (`pool:` in the serve config) are loaded, pinned and "
                                  "unloaded by these routes.", param="model", code="model_not_pooled")
        return spec.pool

    async def _each_replica(self, pool: str, model_id: str, job: Callable[[str], PoolJob]) -> dict[str, Holdings]:
        """`job(replica)` sent to each running replica of `pool` at once; each answer by replica (the replicas
        that stopped meanwhile left out). The first other failure is raised (a 409 from a busy replica)."""
        names = await self.replicas(pool)
        answers = await asyncio.gather(*(self.run(model_id, job(r)) for r in names), return_exceptions=True)
        out: dict[str, Holdings] = {}
        for name, answer in zip(names, answers):
            if isinstance(answer, APIError) and answer.code == REPLICA_GONE:
                continue
            if isinstance(answer, BaseException):
                raise answer
            out[name] = answer
        return out

    def _card(self, model_id: str, held: dict[str, Holdings]) -> dict[str, Any]:
        where = [{"replica": r, "state": h[model_id]["state"], "pinned": h[model_id]["pinned"]}
                 for r, h in sorted(held.items()) if model_id in h]
        states = {w["state"] for w in where}
        return {"id": model_id, "object": "model", "pool": self.specs[model_id].pool,
                "state": "loaded" if "loaded" in states else "loading" if states else "available",
                "pinned": any(w["pinned"] for w in where), "replicas": where}

    async def load(self, request: LoadModelRequest, caller: Any) -> dict[str, Any]:
        pool = self._pool_of(request.model, caller)
        await self.run(request.model, LoadJob())
        return self._card(request.model, await self._each_replica(pool, request.model, PoolStatusJob))

    async def unload(self, request: UnloadModelRequest, caller: Any) -> dict[str, Any]:
        pool = self._pool_of(request.model, caller)
        held = await self._each_replica(pool, request.model, lambda r: UnloadJob(replica=r))
        return self._card(request.model, held)

    async def pin(self, request: PinModelRequest, caller: Any) -> dict[str, Any]:
        pool = self._pool_of(request.model, caller)
        held = await self._each_replica(pool, request.model, lambda r: PinJob(replica=r, pinned=request.pinned))
        if request.pinned and not any(request.model in h for h in held.values()):
            await self.run(request.model, LoadJob(pin=True))  # held nowhere: loaded where it is routed, and kept
            held = await self._each_replica(pool, request.model, PoolStatusJob)
        return self._card(request.model, held)

    async def list(self, request: PoolModelsRequest, caller: Any) -> dict[str, Any]:
        policy = getattr(caller, "policy", None)
        cards = []
        for pool, models in self.pools.items():
            allowed = [m for m in models if may_use(policy, m)]
            if allowed:
                held = await self._each_replica(pool, allowed[0], PoolStatusJob)
                cards += [self._card(m, held) for m in allowed]
        return {"object": "list", "data": cards}
