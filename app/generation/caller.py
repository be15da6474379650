"""Who sent a request, as far as the server needs to know: the identity of the API key it carried (never
the key itself), used to keep one caller's cached prompts away from another's, and the trace it is part of."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Caller:
    """`key_id`: a short digest of the API key the request authenticated with; None when the server runs
    without keys (or the route is open). `traceparent`: W3C trace context of the request's span at the
    Ingress, which the processing's spans join (None when not traced)."""

    key_id: str | None = None
    traceparent: str | None = None

    @classmethod
    def with_key(cls, key: bytes) -> "Caller":
        # A digest, not the key: it crosses Ray hops, lands in cache records and may reach logs.
        return cls(hashlib.sha256(b"llamaray-caller\0" + key).hexdigest()[:16])


ANONYMOUS = Caller()


def cache_scope(caller: Caller, salt: str | None, per_key: bool = True) -> str:
    """The scope a request's prompt may share cached prefixes in (GenerationRequest.cache_scope): one per
    API key (`per_key`) and per `cache_salt`, so no caller can learn from `cached_tokens` what another sent."""
    parts = [(caller.key_id or "") if per_key else "", salt or ""]
    return "" if not any(parts) else hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
