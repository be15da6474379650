"""When a batch line that failed is sent again, by the rules a careful client follows: a 5xx and a timeout yes, with
backoff and a bounded number of tries; a 429 for a rate limit after its `retry-after`, as often as it takes (the
batch has its window: a key's rate is a pace, not a failure); a slot given to interactive work (the engine's
`batch_preempted`, `batch_deferred`; a pool that would have to evict a model) soon, uncounted, the model's window
narrowed; anything else, a 4xx and a spent budget (`insufficient_quota`) among them, never: it goes to the error
file as it is."""

from __future__ import annotations

from dataclasses import dataclass

from ..api.errors import APIError

# Answers that mean "not now, interactive work comes first": the line goes back, the model's window narrows.
YIELDED = frozenset({"batch_preempted", "batch_deferred", "pool_busy_for_batch", "overloaded"})
RETRYABLE_STATUSES = frozenset({408, 500, 502, 503, 504})
MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class Retry:
    delay_s: float
    counted: bool  # it spends one of the line's tries
    yielded: bool  # the model sent it back for interactive work: the runner sends it fewer lines for a while


def retry_after_s(error: APIError) -> float | None:
    value = error.headers.get("retry-after") or error.headers.get("Retry-After")
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < 86400 else None


def retry_of(error: APIError, attempt: int, max_attempts: int, yields: int = 0) -> Retry | None:
    """How to send again a line that failed with `error` after `attempt` counted tries and `yields` times sent back
    for interactive work, or None: its answer is final."""
    if error.code in YIELDED and error.status == 503:
        return Retry(min(2.0, 0.1 * 2 ** min(yields, 4)), counted=False, yielded=True)
    if error.status == 429:
        if error.code == "insufficient_quota":  # a spent budget renews in hours, not seconds
            return None
        return Retry(min(retry_after_s(error) or 1.0, 60.0), counted=False, yielded=False)
    if error.status in RETRYABLE_STATUSES:
        if attempt + 1 >= max_attempts:
            return None
        return Retry(min(MAX_BACKOFF_S, retry_after_s(error) or 0.5 * 2 ** attempt), counted=True, yielded=False)
    return None
