"""Who sent a request, as far as the server needs to know: the identity of the API key it carried (never
the key itself), used to keep one caller's cached prompts away from another's, and the trace it is part of."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ..tenants.policies import KeyPolicy


@dataclass(frozen=True)
class Caller:
    """`key_id`: a short digest of the API key the request authenticated with; None when the server runs
    without keys (or the route is open). `traceparent`: W3C trace context of the request's span at the
    Ingress, which the processing's spans join (None when not traced). `policy`: the key's policy (its
    tenant's name, limits and priority: app/tenants/policies.py); None without keys. `batch`: the batch runner
    sends it, for the key that owns the batch."""

    key_id: str | None = None
    traceparent: str | None = None
    policy: KeyPolicy | None = None
    # Batch work (a line of a batch job, app/batches/): its generations take only the slots interactive requests
    # leave, and its usage is counted as batch usage.
    batch: bool = False

    @classmethod
    def with_key(cls, key: bytes, policy: KeyPolicy | None = None) -> "Caller":
        # A digest, not the key: it crosses Ray hops, lands in cache records and may reach logs.
        return cls(hashlib.sha256(b"llamaray-caller\0" + key).hexdigest()[:16], policy=policy)

    @property
    def tenant(self) -> str:
        """Whose share of the models this request takes (the fair share's unit): the key's tenant name; ""
        for a server without keys (one tenant: first come, first served)."""
        return self.policy.name if self.policy is not None else ""

    @property
    def weight(self) -> float:
        """The tenant's weight in the fair share (its priority's)."""
        return self.policy.weight if self.policy is not None else 1.0


ANONYMOUS = Caller()


def cache_scope(caller: Caller, salt: str | None, per_key: bool = True) -> str:
    """The scope a request's prompt may share cached prefixes in (GenerationRequest.cache_scope): one per
    API key (`per_key`) and per `cache_salt`, so no caller can learn from `cached_tokens` what another sent."""
    parts = [(caller.key_id or "") if per_key else "", salt or ""]
    return "" if not any(parts) else hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
