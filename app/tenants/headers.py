"""A key's rate-limit state as response headers, in each protocol's names: OpenAI's `x-ratelimit-*` (reset as
a duration, "1s", "6m0s") and Anthropic's `anthropic-ratelimit-*` (reset as an RFC 3339 time), plus
`retry-after` (whole seconds) and `retry-after-ms` on a refusal, which the `openai` and `anthropic` SDKs'
retry logic read before their own backoff."""

from __future__ import annotations

import math
import time

from .ledger import Verdict


def duration(seconds: float) -> str:
    """OpenAI's reset format: `20ms`, `1s`, `6m0s`, `1h2m3s`."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def openai_headers(verdict: Verdict) -> dict[str, str]:
    headers = {}
    for name, limit in verdict.limits.items():
        headers[f"x-ratelimit-limit-{name}"] = str(limit.limit)
        headers[f"x-ratelimit-remaining-{name}"] = str(limit.remaining)
        headers[f"x-ratelimit-reset-{name}"] = duration(limit.reset_s)
    return headers | _retry(verdict)


def anthropic_headers(verdict: Verdict, now: float | None = None) -> dict[str, str]:
    now = time.time() if now is None else now
    headers = {}
    for name, limit in verdict.limits.items():
        kind = "requests" if name == "requests" else "tokens"
        headers[f"anthropic-ratelimit-{kind}-limit"] = str(limit.limit)
        headers[f"anthropic-ratelimit-{kind}-remaining"] = str(limit.remaining)
        headers[f"anthropic-ratelimit-{kind}-reset"] = _rfc3339(now + limit.reset_s)
    return headers | _retry(verdict)


def _retry(verdict: Verdict) -> dict[str, str]:
    if verdict.admitted:
        return {}
    wait = max(verdict.retry_after_s, 0.001)
    return {"retry-after": str(max(1, math.ceil(wait))), "retry-after-ms": str(math.ceil(wait * 1000))}


def _rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(math.ceil(t)))
