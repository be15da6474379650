"""The pool deployments' request router: Serve's own (power of two choices, with model multiplexing: a model's
requests go to a replica that holds it), except that an admin job naming its replica (app/pools/admin.py
`PoolJob.replica`) goes to that replica, so an unload or a pin reaches each replica that may hold the model.

Configured by the builder (`request_router_config`, app/ops/pools.py); a `deployments:` block that names another
router loses the admin routes' reach to every replica (an unload then reaches one replica only)."""

from __future__ import annotations

# Serve's default router class (the pinned Ray 2.60 exports no public name for it).
from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import PendingRequest, RunningReplica

from app.pools.admin import PoolJob


def named_replica(pending_request: PendingRequest | None) -> str | None:
    """The replica an admin job names (None: any other call, or a job for wherever its model is routed)."""
    if pending_request is None:
        return None
    for arg in (*pending_request.args, *pending_request.kwargs.values()):
        if isinstance(arg, PoolJob):
            return arg.replica
    return None


class PoolRouter(PowerOfTwoChoicesRequestRouter):
    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        name = named_replica(pending_request)
        if name is not None:
            named = [r for r in candidate_replicas if r.replica_id.unique_id == name]
            if named:
                return [named]
            # Gone: any replica takes it and answers `replica_gone` (LlamaPool.run), which the admin skips.
        return await super().choose_replicas(candidate_replicas, pending_request)
