"""Map Ray's own failures (dead replicas, back-pressure) onto OpenAI-shaped errors."""

from __future__ import annotations

from ray import exceptions as ray_exc
from ray.serve import exceptions as serve_exc

from app.errors import APIError, as_api_error, internal_error, overloaded, service_unavailable


def to_api_error(exc: BaseException) -> APIError:
    api = as_api_error(exc)
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
    return internal_error()
