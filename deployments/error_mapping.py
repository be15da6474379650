"""Failures behind a model call as the protocol's errors: the engine's (app/engine/errors.py, mapped by
app.api.errors.as_api_error), and Ray's own (dead replicas, back-pressure). Both topologies' model calls
pass here (deployments/models.py): an engine error is mapped where it reaches the processing.

A refusal (a 4xx, a busy 503: app/observe/refusals.py) crosses a Ray hop as a value (`Refused`), not as the
call's exception: Serve logs every exception a deployment's method raises as an ERROR line and counts the call
as failed, and a refusal is neither. `answered` makes the value on the callee's side; `call_mapped` and the
streams' callers (relay, served) raise it again on the caller's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from ray import exceptions as ray_exc
from ray.serve import exceptions as serve_exc

import logging

from dataclasses import dataclass
from typing import Any

from app.api.errors import APIError, as_api_error, internal_error, overloaded, service_unavailable
from app.observe.refusals import is_refusal
from app.transport.stream_channels import ChannelLost

log = logging.getLogger("ray.serve")

T = TypeVar("T")


def to_api_error(exc: BaseException) -> APIError:
    api = as_api_error(exc)  # an APIError, or an engine error (itself, or inside RayTaskError) mapped
    if api is not None:
        return api
    if isinstance(exc, serve_exc.BackPressureError):
        return overloaded()
    if isinstance(exc, ChannelLost):
        return service_unavailable(str(exc), code="replica_unavailable")
    if isinstance(exc, (serve_exc.DeploymentUnavailableError, ray_exc.ActorDiedError,
                        ray_exc.ActorUnavailableError, ray_exc.RayActorError)):
        return service_unavailable("A model replica failed while serving this request; retry shortly.",
                                   code="replica_unavailable")
    if isinstance(exc, ray_exc.RayTaskError) and exc.cause is not None:
        return to_api_error(exc.cause)
    # A bug, not a condition: its traceback is logged here, where it is still known (the client gets a 500).
    log.error("llamaray: unexpected failure behind a handle call: %r", exc, exc_info=exc)
    return internal_error(logged=True)


@dataclass(frozen=True)
class Refused:
    """A refusal on its way back over a Ray hop, as the call's answer (or a stream's last item)."""

    error: APIError


async def answered(work: Awaitable[T]) -> T | Refused:
    """A deployment method's answer: `work`'s, or its refusal as a value (any other failure is raised)."""
    try:
        return await work
    except Exception as exc:
        api = as_api_error(exc)
        if api is not None and is_refusal(api):
            return Refused(api)
        raise


def unrefused(answer: Any) -> Any:
    """The caller's side of `answered`: the answer, or its refusal raised."""
    if isinstance(answer, Refused):
        raise answer.error
    return answer


async def call_mapped(start: Callable[[], Awaitable[T]]) -> T:
    """`await start()` (a handle call), with Ray's failures raised as API errors and a refusal made a value
    (`Refused`) raised again. `start` runs inside the mapping, so a failure while the call is placed is mapped
    too."""
    try:
        answer = await start()
    except Exception as exc:  # noqa: BLE001 - back-pressure, dead replicas... as OpenAI errors
        raise to_api_error(exc) from None
    return unrefused(answer)
