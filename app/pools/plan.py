"""What one pool's replicas need to know, resolved at build time: its bounds and each model's measured need."""

from __future__ import annotations

from dataclasses import dataclass, field

MIB = 1 << 20


@dataclass(frozen=True)
class PoolPlan:
    """`needs`: each model's memory in bytes (its GGUF's size plus its KV cache; 0 when not measured: a
    remote file not fetched at build time). `budget_bytes` None: no memory budget. `failed_load_retry_s`: how long
    a replica answers a model whose load failed with that failure before it tries the load again. `room_wait_s`: how
    long a request for a model that finds every model held busy waits for one to go idle before its 503."""

    name: str
    max_models: int
    budget_bytes: int | None = None
    pinned: tuple[str, ...] = ()
    idle_unload_s: float = 0.0
    failed_load_retry_s: float = 30.0
    needs: dict[str, int] = field(default_factory=dict)
    room_wait_s: float = 30.0
    # How long such a request waits before it claims the model it will replace (its new requests wait then too).
    claim_after_s: float = 5.0

    @property
    def models(self) -> list[str]:
        return list(self.needs)


def mib(n: int | float) -> str:
    return f"{n / MIB:,.0f} MiB"
