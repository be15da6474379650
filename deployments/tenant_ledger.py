"""The cluster's tenant ledger (app/tenants/ledger.py): one Ledger in a deployment-scoped actor of the
deployment that runs the processing (ChatProcessor in topology `graph`, the Ingress in `single`), shared by
its replicas through `ActorLedger` (app/tenants/gate.py's SharedLedger). Made when keys come from a keys
file, the only place limits can be set; without one, each replica counts usage in its own process.

A deployment actor for the reasons deployments/response_store.py gives (made before the replicas, recreated
by Serve's controller, gone with the app). Its usage and budgets are saved to `usage_snapshot` every few
seconds when they changed and read back when it starts, so they outlive the actor, the replicas and a
redeploy; at most the last few seconds of usage are lost with the actor."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.serve.config import DeploymentActorConfig

from app.config.app_args import AuthConfig
from app.serving.tenancy import Tenancy
from app.tenants.gate import InProcessLedger, TenantGate
from app.tenants.ledger import Ledger, Usage, Verdict
from app.tenants.policies import KeyPolicy
from app.tenants.snapshots import load_snapshot, save_snapshot

from .actor_client import DeploymentActorClient
from .metrics import TenantMetrics

LEDGER_ACTOR = "tenant_ledger"
SAVE_EVERY_S = 5.0


@ray.remote
class LedgerActor:
    """A Ledger behind Ray calls, one call at a time (the actor's default), saved in the background."""

    def __init__(self, snapshot_url: str | None = None, save_every_s: float = SAVE_EVERY_S) -> None:
        self.ledger = Ledger()
        self.url = snapshot_url
        self.lock = threading.Lock()
        self.dirty = False
        if snapshot_url:
            self.ledger.restore(load_snapshot(snapshot_url))
            threading.Thread(target=self._saver, args=(save_every_s,), daemon=True, name="ledger-save").start()

    def admit(self, policy: KeyPolicy) -> Verdict:
        with self.lock:
            return self.ledger.admit(policy)

    def settle(self, policy: KeyPolicy, model: str, usage: Usage) -> None:
        with self.lock:
            self.ledger.settle(policy, model, usage)
            self.dirty = True

    def release(self, policy: KeyPolicy) -> None:
        with self.lock:
            self.ledger.release(policy)

    def record(self, batch: list[Any]) -> None:
        with self.lock:
            self.ledger.settle_owed(batch)
            self.dirty = True

    def usage_report(self) -> dict[str, Any]:
        with self.lock:
            return self.ledger.usage_report()

    def save(self) -> None:
        with self.lock:
            snapshot, self.dirty = self.ledger.snapshot(), False
        save_snapshot(self.url, snapshot)

    def _saver(self, every_s: float) -> None:
        while True:
            time.sleep(every_s)
            if self.dirty:
                try:
                    self.save()
                except Exception:  # noqa: BLE001 - tried again at the next tick
                    self.dirty = True


def shared_ledger(auth: AuthConfig) -> bool:
    return auth.api_keys_file is not None


def ledger_actors(auth: AuthConfig) -> list[DeploymentActorConfig]:
    """The processing deployment's `deployment_actors`: the ledger (num_cpus 0: dictionary work per request),
    when keys come from a file."""
    if not shared_ledger(auth):
        return []
    return [DeploymentActorConfig(name=LEDGER_ACTOR, actor_class=LedgerActor, actor_options={"num_cpus": 0},
                                  init_kwargs={"snapshot_url": auth.usage_snapshot})]


def tenancy(auth: AuthConfig) -> Tenancy:
    """The processing's tenant gate: over the deployment's ledger actor (ledger_actors), or over a ledger in
    this process when there is none."""
    events = TenantMetrics()
    shared = ActorLedger() if shared_ledger(auth) else InProcessLedger()
    return Tenancy(TenantGate(shared, on_degraded=events.degraded), events)


class ActorLedger:
    """app.tenants.gate.SharedLedger over the ledger actor of this replica's deployment; looked up again after
    it died. Failures are raised: the gate turns them into per-replica limits."""

    def __init__(self, lookup: Callable[[], Any] | None = None) -> None:
        self.actor = DeploymentActorClient(LEDGER_ACTOR, _unreachable, lookup)

    async def admit(self, policy: KeyPolicy) -> Verdict:
        return await self.actor.call("admit", policy)

    async def settle(self, policy: KeyPolicy, model: str, usage: Usage) -> None:
        await self.actor.call("settle", policy, model, usage)

    async def release(self, policy: KeyPolicy) -> None:
        await self.actor.call("release", policy)

    async def record(self, batch: list[Any]) -> None:
        await self.actor.call("record", batch)

    async def usage_report(self) -> dict[str, Any]:
        return await self.actor.call("usage_report")


class LedgerUnreachable(RuntimeError):
    """The ledger actor is dead or not yet recreated."""


def _unreachable(cause: BaseException) -> Exception:
    return LedgerUnreachable(f"the tenant ledger is unreachable: {cause!r}")
