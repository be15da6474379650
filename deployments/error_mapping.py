"""Failures behind a model call as the protocol's errors: the engine's (app/engine/errors.py, mapped by
app.api.errors.as_api_error), and Ray's own (dead replicas, back-pressure). Both topologies' model calls
pass here (deployments/models.py): an engine error is mapped where it reaches the processing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from ray import exceptions as ray_exc
from ray.serve import exceptions as serve_exc

import logging

from app.api.errors import APIError, as_api_error, internal_error, overloaded, service_unavailable

log = logging.getLogger("ray.serve")

T = TypeVar("T")


def to_api_error(exc: BaseException) -> APIError:
    api = as_api_error(exc)  # an APIError, or an engine error (itself, or inside RayTaskError) mapped
    if api is not None:
        return api
    if isinstance(exc, serve_exc.BackPressureError):
        return overloaded()
    if isinstance(exc, (serve_exc.DeploymentUnavailableError, ray_exc.ActorDiedError,
                        ray_exc.ActorUnavailableError, ray_exc.RayActorError)):
        return service_unavailable("A model replica failed while serving this request; retry shortly.",
                                   code="replica_unavailable")
    if isinstance(exc, ray_exc.RayTaskError) and exc.cause is not None:
        return to_api_error(exc.cause)
    # A bug, not a condition: its traceback is logged here, where it is still known (the client gets a 500).
    log.error("llamaray: unexpected failure behind a handle call: %r", exc, exc_info=exc)
    return internal_error(logged=True)


async def call_mapped(start: Callable[[], Awaitable[T]]) -> T:
    """`await start()` (a handle call), with Ray's failures raised as API errors. `start` runs inside the
    mapping, so a failure while the call is placed is mapped too."""
    try:
        return await start()
    except Exception as exc:  # noqa: BLE001 - back-pressure, dead replicas... as OpenAI errors
        raise to_api_error(exc) from None
