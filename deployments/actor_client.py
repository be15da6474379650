"""Calls to a deployment-scoped actor (`serve.get_deployment_actor`: the Responses store, the tenant ledger),
surviving its restart: the Serve controller recreates a dead one under the same name, so a handle cached
before that fails once and is looked up anew."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ray import exceptions as ray_exc
from ray import serve


class DeploymentActorClient:
    """`call(method, *args)` on the actor `name` of this replica's deployment (`lookup`: how it is found; tests
    pass their own). `unavailable(cause)`: the exception raised when it cannot be reached (dead, or not yet
    recreated)."""

    def __init__(self, name: str, unavailable: Callable[[BaseException], Exception],
                 lookup: Callable[[], Any] | None = None) -> None:
        self.lookup = lookup or (lambda: serve.get_deployment_actor(name))
        self.unavailable = unavailable
        self.actor: Any = None

    async def call(self, method: str, *args: Any) -> Any:
        # Twice at most: a handle cached before the actor was recreated fails once, then is looked up anew.
        for attempt in (1, 2):
            try:
                if self.actor is None:
                    self.actor = await asyncio.to_thread(self._lookup)
                return await getattr(self.actor, method).remote(*args)
            except ray_exc.RayActorError as exc:  # dead or unreachable (ActorUnavailableError is one too)
                self.actor = None
                if attempt == 2:
                    raise self.unavailable(exc) from None
        raise AssertionError("unreachable")

    def _lookup(self) -> Any:
        try:
            return self.lookup()
        except ValueError as exc:  # no actor of that name yet: the controller is recreating it
            raise self.unavailable(exc) from None
