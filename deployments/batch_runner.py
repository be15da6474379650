"""The batch runner (app/batches/runner.py) in a Ray actor of its own: a Serve deployment-scoped actor of the
deployment that runs the processing (the ChatProcessor in topology `graph`, the Ingress in `single`), beside the
response store and the tenant ledger. It sends each line of every open batch through that deployment's handle
(`respond`, the very processing an HTTP request reaches: validation, planning, tools, grammars, adapters, pools,
the key's limits), so batch work takes Serve's routing and the engines' slots like any request, at the lowest
priority (the Caller says batch: app/engine/admission.py).

Why a deployment actor rather than a detached one: what must outlive a restart is in the store (app/batches/
store.py), not in the actor. Serve's controller creates it before the replicas, recreates it when it dies (the new
one resumes every open batch from the store), and kills it with the app, so nothing keeps sending lines to an app
that was deleted; an app started again over the same store resumes its batches. Its work runs on an event loop of
its own thread, so the actor's health checks and its `submit`/`cancel` calls never wait behind it."""

from __future__ import annotations

import asyncio
import base64
import logging
import pickle
import threading
from collections.abc import Callable
from typing import Any

import ray
from ray import serve
from ray.serve.config import DeploymentActorConfig

from app.batches.records import BatchRecord
from app.batches.runner import BatchRunner, KeyRevoked
from app.batches.service import BatchService
from app.batches.store import BatchStore, storage_url
from app.config.app_args import AppArgs, BatchConfig, Limits
from app.config.spec import ModelSpec
from app.generation.caller import Caller
from app.http.auth import load_key_registry
from app.tenants.policies import KeyPolicy

from .actor_client import DeploymentActorClient
from .error_mapping import call_mapped
from .handles import unary
from .metrics import BatchMetrics

log = logging.getLogger("ray.serve")

RUNNER_ACTOR = "batch_runner"


def lines_per_model(batch: BatchConfig, specs: list[ModelSpec], topology: str) -> dict[str, int]:
    """Each model's batch lines in flight at most: `batch.lines_per_model`, else its slots; in the graph one
    less, because Serve's queue in front of a model replica (max_ongoing_requests = the slots) has no priorities:
    a slot's worth of room there lets an interactive request reach the engine, which then takes a slot from a
    batch line for it."""
    if batch.lines_per_model:
        return {s.id: batch.lines_per_model for s in specs}
    return {s.id: max(1, s.n_seq_max - (1 if topology == "graph" else 0)) for s in specs}


def runner_actors(parsed: AppArgs, specs: list[ModelSpec]) -> list[DeploymentActorConfig]:
    """The processing deployment's `deployment_actors`: the runner, unless batch jobs are off (num_cpus 0: it
    reads the store and sends requests; the models' replicas do the work)."""
    if not parsed.batch.enabled:
        return []
    # Serve keeps a deployment actor's init kwargs as plain data (a pydantic model or a dataclass arrives a dict):
    # what the runner needs goes pickled, as text, and comes back as the objects it was.
    setup = (parsed.batch, specs, parsed.limits, parsed.auth, parsed.topology)
    return [DeploymentActorConfig(name=RUNNER_ACTOR, actor_class=BatchRunnerActor, actor_options={"num_cpus": 0},
                                  init_kwargs={"setup": base64.b64encode(pickle.dumps(setup)).decode()})]


def batch_store(batch: BatchConfig) -> BatchStore:
    return BatchStore(storage_url(batch.storage))


def max_line_bytes(batch: BatchConfig, limits: Limits) -> int:
    return batch.max_line_bytes or limits.max_body_bytes


@ray.remote
class BatchRunnerActor:
    def __init__(self, setup: str) -> None:
        batch, specs, limits, auth, topology = pickle.loads(base64.b64decode(setup))
        self.app = serve.get_deployment_actor_context().app_name
        self.target = "ChatProcessor" if topology == "graph" else "Ingress"
        self.registry = load_key_registry(auth.api_keys_env, auth.api_keys_file)
        self.runner = BatchRunner(batch_store(batch), batch, specs, self._respond, self._policy,
                                  max_line_bytes=max_line_bytes(batch, limits), max_messages=limits.max_messages,
                                  lines_per_model=lines_per_model(batch, specs, topology), events=BatchMetrics())
        self.handle: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        started = threading.Event()
        threading.Thread(target=self._main, args=(started,), daemon=True, name="batch-runner").start()
        started.wait(30)

    def _main(self, started: threading.Event) -> None:
        async def serve_forever() -> None:
            self.loop = asyncio.get_running_loop()
            started.set()
            await self.runner.serve()

        asyncio.run(serve_forever())

    async def _respond(self, request: Any, caller: Caller) -> Any:
        if self.handle is None:
            handle = await asyncio.to_thread(serve.get_deployment_handle, self.target, self.app)
            self.handle = unary(handle)
        sent: list[Any] = []

        def send() -> Any:
            sent.append(self.handle.respond.remote(request, caller))
            return sent[0]
        try:
            return await call_mapped(send)
        except asyncio.CancelledError:
            # A cancel or the window's end stops the line: its generation is cancelled where it runs (a response
            # awaited on this thread's loop is not cancelled there by the await's own cancellation).
            if sent:
                sent[0].cancel()
            raise

    def _policy(self, record: BatchRecord) -> KeyPolicy | None:
        if record.key_sha256 is None:
            return None  # made on a server without keys
        policy = self.registry.find_hash(record.key_sha256) if self.registry.enabled else None
        if policy is None:
            raise KeyRevoked(record.key_sha256[:12])
        return policy

    def _on_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        if self.loop is None:
            raise RuntimeError("the batch runner's loop has not started")
        self.loop.call_soon_threadsafe(fn, *args)

    def submit(self, owner: str, batch_id: str) -> None:
        self._on_loop(self.runner.submit, owner, batch_id)

    def cancel(self, owner: str, batch_id: str) -> None:
        self._on_loop(self.runner.cancel, owner, batch_id)

    def status(self) -> dict[str, Any]:
        """The batches running and each model's window (tests, operators)."""
        return {"running": sorted(self.runner.jobs),
                "windows": {m: {"size": w.size, "limit": w.limit, "in_flight": w.in_flight}
                            for m, w in self.runner.windows.items()}}


class ActorBatchRunner:
    """app.batches.service.Runner over the runner actor of this replica's deployment; a runner away is told
    nothing (it finds the store's open batches when it is back)."""

    def __init__(self, lookup: Callable[[], Any] | None = None) -> None:
        self.actor = DeploymentActorClient(RUNNER_ACTOR, _away, lookup)

    async def submit(self, owner: str, batch_id: str) -> None:
        await self.actor.call("submit", owner, batch_id)

    async def cancel(self, owner: str, batch_id: str) -> None:
        await self.actor.call("cancel", owner, batch_id)


class RunnerAway(RuntimeError):
    """The runner actor is dead or not yet recreated."""


def _away(cause: BaseException) -> Exception:
    return RunnerAway(f"the batch runner is unreachable: {cause!r}")


def batch_service(batch: BatchConfig) -> BatchService | None:
    """The processing's batch routes (None: batch jobs are off)."""
    if not batch.enabled:
        return None
    return BatchService(batch_store(batch), batch, ActorBatchRunner())
