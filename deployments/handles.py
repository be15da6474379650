"""How the graph's deployments call each other.

A stream's request and its streamed items go by value over the replica's gRPC channel (Ray Serve's
`_by_reference=False`, what RAY_SERVE_USE_GRPC_BY_DEFAULT makes the default), not as a Ray object
reference through the object store and the owner's bookkeeping. `python -m bench.graph` measured the
difference at GPU speed: the CPU each streamed chunk costs the ChatProcessor, the model replica and Ray's own
processes about halves, on any cluster, whatever its nodes' environment.

But that channel refuses any message over RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH (4 MiB by default) in
either direction, and a client's request may legally be near it (a 4 MiB body, an image's pixels, 2,048
inputs to embed) and so may a whole reply (embeddings of a large model, an answer with logprobs, a stored
response). So a stream whose request is large goes by reference, and unary calls (one per request, where
the per-chunk saving does not apply) always do: the object store has no such cap. Values that cross must
pickle (they do: docs/architecture.md)."""

from __future__ import annotations

import pickle
from typing import Any

from ray.serve.handle import DeploymentHandle

# Well under gRPC's 4 MiB: what else travels with a request (its metadata, Serve's own envelope) fits.
BY_VALUE_MAX_BYTES = 1024 * 1024


def wire_bytes(args: tuple[Any, ...]) -> int:
    """What `args` take pickled, as a call carries them (tens of microseconds for a usual request)."""
    return len(pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL))


class StreamHop:
    """A deployment's streaming handle: by value for a usual request, by reference for a large one."""

    def __init__(self, handle: DeploymentHandle) -> None:
        self.by_value = handle.options(_by_reference=False, stream=True)
        # Said, not left to Serve's default, which RAY_SERVE_USE_GRPC_BY_DEFAULT (Ray Serve's throughput settings,
        # on the clusters' nodes) turns into by value.
        self.by_reference = handle.options(_by_reference=True, stream=True)

    def to(self, *args: Any) -> DeploymentHandle:
        return self.by_reference if wire_bytes(args) > BY_VALUE_MAX_BYTES else self.by_value


def unary(handle: DeploymentHandle) -> DeploymentHandle:
    """A deployment's handle for calls that answer once: by reference, whatever the request's or reply's size."""
    return handle.options(_by_reference=True)
