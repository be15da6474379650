"""What the Ingress's middleware leaves in a request's scope for the handlers (the caller, its key's policy, its
trace context), how they read it, and what the scope says about the request itself (its route, its id)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from starlette.requests import Request

from ..generation.caller import ANONYMOUS, Caller
from ..tenants.policies import KeyPolicy

CALLER_STATE = "llamaray.caller"
POLICY_STATE = "llamaray.key_policy"  # the key's policy (app/tenants/policies.py): its models, its limits
TRACE_STATE = "llamaray.traceparent"


def route_path(scope: Any) -> str:
    """The path the app routes on: Serve keeps `route_prefix` in `path` and puts it in `root_path`."""
    path, root = scope["path"], scope.get("root_path", "")
    return (path[len(root):] or "/") if root and path.startswith(root) else path


def policy_of(request: Request) -> KeyPolicy | None:
    """The policy of the key the request carries (None: the server runs without keys, or an open route)."""
    return request.scope.get("state", {}).get(POLICY_STATE)


def caller_of(request: Request) -> Caller | None:
    """Who sent the request, as the key middleware found it (None: no valid key on an open route), with the
    request's trace context when it is traced."""
    state = request.scope.get("state", {})
    caller = state.get(CALLER_STATE, ANONYMOUS)
    traceparent = state.get(TRACE_STATE)
    return replace(caller, traceparent=traceparent) if caller is not None and traceparent else caller


def request_id_of(scope: Any) -> str:
    """The request's id as Ray Serve and HAProxy set it (`x-request-id`, also sent back to the client)."""
    for name, value in scope.get("headers") or ():
        if name == b"x-request-id":
            return value.decode("latin-1")[:64]
    return ""


def tenant_of(scope: Any) -> str:
    """The name of the key the request carried (never the key), as the key middleware found it."""
    policy = scope.get("state", {}).get(POLICY_STATE)
    return policy.name if policy is not None else ""
