"""The counts behind every key's limits, kept in one place for the whole cluster (an actor in the graph,
this object itself in one process): requests and tokens per minute as buckets refilled continuously, requests
in flight, the token budget of the day or month, and each key's usage per model.

One call admits a request (`admit`) and one returns it (`settle`, with its usage): nothing per token. Tokens
are counted when usage is known, so a key can pass its token limits by what its requests in flight use;
the budget is checked against what settled requests used plus an estimate per request in flight."""

from __future__ import annotations

import calendar
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .policies import KeyPolicy

log = logging.getLogger("llamaray.tenants")

# A request that used more tokens than a minute's allowance puts the key in debt of at most one minute's
# worth: it waits a minute at most, not hours, for one oversized reply.
MAX_DEBT_MINUTES = 1.0
# A request counted in flight longer than this is let go without its settle: the replica that admitted it
# died. Longer than any request may run (limits.request_timeout_s, 300 s by default), so a live one is
# never let go early, and a key never stays blocked on its concurrency limit by a lost replica.
IN_FLIGHT_HOLD_S = 900.0


@dataclass
class Bucket:
    """`capacity` per minute, refilled continuously (a token bucket: bursts up to a minute's allowance)."""

    capacity: float
    level: float
    stamp: float

    @classmethod
    def full(cls, capacity: float, now: float) -> "Bucket":
        return cls(capacity, capacity, now)

    @property
    def per_s(self) -> float:
        return self.capacity / 60.0

    def refill(self, now: float) -> None:
        if now > self.stamp:
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.per_s)
            self.stamp = now

    def wait_s(self, amount: float) -> float:
        """Seconds until `amount` can be taken (0: now)."""
        return max(0.0, (amount - self.level) / self.per_s)

    def reset_s(self) -> float:
        """Seconds until the bucket is full again (OpenAI's `x-ratelimit-reset-*`)."""
        return max(0.0, (self.capacity - self.level) / self.per_s)

    def take(self, amount: float) -> None:
        self.level = max(self.level - amount, -self.capacity * MAX_DEBT_MINUTES)

    def resize(self, capacity: float) -> None:
        """A reloaded policy's new limit; what was used in the last minute still counts."""
        used = self.capacity - self.level
        self.capacity = capacity
        self.level = min(capacity, capacity - used)


def period_of(per: str, now: float) -> tuple[str, float]:
    """The calendar period (UTC) a budget counts in, and when the next begins."""
    t = time.gmtime(now)
    if per == "day":
        start = calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0))
        return time.strftime("%Y-%m-%d", t), start + 86400.0
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return time.strftime("%Y-%m", t), float(calendar.timegm((year, month, 1, 0, 0, 0)))


@dataclass
class Usage:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    # Of the above, what lines of batch jobs used (app/batches/): requests, and prompt + completion tokens.
    batch_requests: int = 0
    batch_tokens: int = 0

    def add(self, other: "Usage") -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.cached_tokens += other.cached_tokens
        self.completion_tokens += other.completion_tokens
        self.batch_requests += other.batch_requests
        self.batch_tokens += other.batch_tokens

    @property
    def tokens(self) -> int:
        """What limits and budgets count: prompt + completion (cached prompt tokens included, as billed)."""
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, int]:
        counts = {"requests": self.requests, "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                  "completion_tokens": self.completion_tokens}
        if self.batch_requests:  # a key that never ran a batch keeps the four counts it always had
            counts.update(batch_requests=self.batch_requests, batch_tokens=self.batch_tokens)
        return counts


@dataclass(frozen=True)
class Limit:
    """One limit's state for the rate-limit headers: `limit`, what is `remaining`, seconds to `reset`."""

    limit: int
    remaining: int
    reset_s: float


@dataclass(frozen=True)
class Verdict:
    """Whether a request may run. Refused: `reason` (requests, tokens, concurrency, budget) and
    `retry_after_s`. `limits`: requests/tokens state for the headers, either way."""

    admitted: bool
    reason: str | None = None
    retry_after_s: float = 0.0
    limits: dict[str, Limit] = field(default_factory=dict)
    message: str = ""


@dataclass
class _KeyState:
    policy: KeyPolicy
    requests: Bucket | None = None
    tokens: Bucket | None = None
    holds: list[float] = field(default_factory=list)  # when each request in flight is let go at the latest
    period: str = ""
    period_ends: float = 0.0
    budget_used: int = 0


class Ledger:
    """Every key's counts. `clock`: wall time (budgets follow the calendar)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._keys: dict[str, _KeyState] = {}
        # name -> model -> usage; kept across policy reloads (a renamed key starts a new record).
        self.usage: dict[str, dict[str, Usage]] = {}
        self._restored_budgets: dict[str, tuple[str, float, int]] = {}

    def _state(self, policy: KeyPolicy, now: float) -> _KeyState:
        state = self._keys.get(policy.name)
        if state is None or state.policy != policy:
            state = self._renewed(state, policy, now)
            restored = self._restored_budgets.pop(policy.name, None)
            if restored is not None and policy.token_budget is not None and restored[1] > now:
                state.period, state.period_ends, state.budget_used = restored
            self._keys[policy.name] = state
        for bucket in (state.requests, state.tokens):
            if bucket is not None:
                bucket.refill(now)
        if state.holds and state.holds[0] <= now:
            state.holds = [t for t in state.holds if t > now]
        if policy.token_budget is not None and now >= state.period_ends:
            state.period, state.period_ends = period_of(policy.token_budget.per, now)
            state.budget_used = 0
        return state

    @staticmethod
    def _renewed(old: _KeyState | None, policy: KeyPolicy, now: float) -> _KeyState:
        state = _KeyState(policy)
        for name, capacity in (("requests", policy.requests_per_minute), ("tokens", policy.tokens_per_minute)):
            bucket = getattr(old, name, None) if old is not None else None
            if capacity is None:
                continue
            if bucket is None:
                bucket = Bucket.full(float(capacity), now)
            else:
                bucket.resize(float(capacity))
            setattr(state, name, bucket)
        if old is not None:
            state.holds = old.holds
            if policy.token_budget is not None and old.policy.token_budget is not None \
                    and old.policy.token_budget.per == policy.token_budget.per:
                state.period, state.period_ends, state.budget_used = old.period, old.period_ends, old.budget_used
        return state

    def admit(self, policy: KeyPolicy) -> Verdict:
        """Count a request in, or say why not and for how long."""
        now = self.clock()
        state = self._state(policy, now)
        refusal = self._refusal(state, now)
        if refusal is not None:
            return refusal
        if state.requests is not None:
            state.requests.take(1)
        state.holds.append(now + IN_FLIGHT_HOLD_S)
        return Verdict(True, limits=self._limits(state))

    def _refusal(self, state: _KeyState, now: float) -> Verdict | None:
        policy = state.policy
        if policy.max_concurrent is not None and len(state.holds) >= policy.max_concurrent:
            return Verdict(False, "concurrency", 1.0, self._limits(state),
                           f"Too many requests in flight for this key: at most {policy.max_concurrent} at once.")
        budget = policy.token_budget
        if budget is not None and state.budget_used >= budget.tokens:
            return Verdict(False, "budget", state.period_ends - now, self._limits(state),
                           f"This key's token budget for the {budget.per} ({budget.tokens} tokens) is spent; it "
                           f"renews at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(state.period_ends))}.")
        if state.requests is not None and state.requests.level < 1:
            return Verdict(False, "requests", state.requests.wait_s(1), self._limits(state),
                           f"Rate limit reached: {policy.requests_per_minute} requests per minute for this key.")
        if state.tokens is not None and state.tokens.level <= 0:
            return Verdict(False, "tokens", state.tokens.wait_s(1), self._limits(state),
                           f"Rate limit reached: {policy.tokens_per_minute} tokens per minute for this key.")
        return None

    def settle(self, policy: KeyPolicy, model: str, usage: Usage) -> None:
        """A request admitted here is over: its tokens counted against the key's limits, its usage recorded."""
        state = self._state(policy, self.clock())
        self._let_go(state)
        self._charge(state, usage)
        self._add_usage(policy.name, model, usage)

    def record(self, policy: KeyPolicy, model: str, usage: Usage) -> None:
        """Usage reported after the fact (an unlimited key's batch; a replica's count while this ledger was
        unreachable): recorded, and charged to the key's limits and budget."""
        if policy.limited:
            self._charge(self._state(policy, self.clock()), usage)
        self._add_usage(policy.name, model, usage)

    def settle_owed(self, batch: list[tuple[KeyPolicy, str, "Usage | None", bool]]) -> None:
        """What replicas still owed (app/tenants/gate.py's Owed): requests they admitted that are over (their
        settle was lost), and usage reported after the fact."""
        for policy, model, usage, admitted in batch:
            if admitted:
                self.release(policy)
            if usage is not None:
                self.record(policy, model, usage)

    @staticmethod
    def _charge(state: _KeyState, usage: Usage) -> None:
        if state.tokens is not None:
            state.tokens.take(usage.tokens)
        if state.policy.token_budget is not None:
            state.budget_used += usage.tokens

    def _add_usage(self, name: str, model: str, usage: Usage) -> None:
        self.usage.setdefault(name, {}).setdefault(model, Usage()).add(usage)

    def release(self, policy: KeyPolicy) -> None:
        """A request admitted here ended without usage to count (refused by the processing, cancelled before
        the model ran)."""
        state = self._keys.get(policy.name)
        if state is not None:
            self._let_go(state)

    @staticmethod
    def _let_go(state: _KeyState) -> None:
        if state.holds:
            state.holds.pop(0)

    def _limits(self, state: _KeyState) -> dict[str, Limit]:
        limits = {}
        for name, bucket in (("requests", state.requests), ("tokens", state.tokens)):
            if bucket is not None:
                limits[name] = Limit(int(bucket.capacity), max(0, math.floor(bucket.level)), bucket.reset_s())
        return limits

    def usage_report(self) -> dict[str, Any]:
        """Every key's usage by model, and its budget's state: what the admin route returns."""
        keys = {}
        for name, models in sorted(self.usage.items()):
            keys[name] = {"models": {m: u.to_dict() for m, u in sorted(models.items())}}
        for name, state in self._keys.items():
            budget = state.policy.token_budget
            entry = keys.setdefault(name, {"models": {}})
            entry["in_flight"] = len(state.holds)
            if budget is not None:
                entry["budget"] = {"tokens": budget.tokens, "per": budget.per, "period": state.period,
                                   "used": state.budget_used}
        return {"keys": keys}

    def snapshot(self) -> dict[str, Any]:
        """What must outlive this ledger (usage and budgets), as plain data."""
        return {"usage": {n: {m: u.to_dict() for m, u in ms.items()} for n, ms in self.usage.items()},
                "budgets": {n: [s.period, s.period_ends, s.budget_used] for n, s in self._keys.items()
                            if s.policy.token_budget is not None}}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """A snapshot taken by an earlier ledger: its usage at once, its budgets as each key is next seen (a
        budget counts only in the period it was taken in). An entry that is not what `snapshot` writes (a file
        edited by hand, or damaged) is skipped with a warning: the ledger starts with the rest."""
        usage, budgets = snapshot.get("usage"), snapshot.get("budgets")
        for name, models in (usage.items() if isinstance(usage, dict) else ()):
            for model, counts in (models.items() if isinstance(models, dict) else ()):
                restored = _restored_usage(counts)
                if restored is None:
                    log.warning("usage snapshot: the entry of key %r, model %r is not usage; skipped", name, model)
                    continue
                self._add_usage(str(name), str(model), restored)
        for name, entry in (budgets.items() if isinstance(budgets, dict) else ()):
            budget = _restored_budget(entry)
            if budget is None:
                log.warning("usage snapshot: the budget of key %r is not [period, ends, used]; skipped", name)
                continue
            self._restored_budgets[str(name)] = budget


def _count(value: Any) -> int | None:
    """A count as a snapshot holds it: a non-negative whole number (bool, float and text are not)."""
    return value if type(value) is int and 0 <= value <= 10**18 else None


def _restored_usage(counts: Any) -> Usage | None:
    if not isinstance(counts, dict) or set(counts) - set(Usage(batch_requests=1).to_dict()):
        return None
    values = {k: _count(v) for k, v in counts.items()}
    return None if None in values.values() else Usage(**values)


def _restored_budget(entry: Any) -> tuple[str, float, int] | None:
    if not isinstance(entry, (list, tuple)) or len(entry) != 3:
        return None
    period, ends, used = entry
    if not isinstance(period, str) or type(ends) not in (int, float) or not math.isfinite(ends) \
            or _count(used) is None:
        return None
    return period, float(ends), used
