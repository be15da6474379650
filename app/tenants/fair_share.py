"""Fair share of a model's slots among keys: when more requests wait than slots free up, the next slot goes
to the waiting request whose key holds the fewest slots per unit of weight (its priority's), first come
first served within a key and between equals. A greedy key with sixteen streams then waits behind a key
with one, instead of the other key waiting behind all sixteen."""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

T = TypeVar("T")


def fair_order(waiting: Iterable[T], tenant_of: Callable[[T], Hashable], weight_of: Callable[[T], float],
               running: Counter | None = None, size_of: Callable[[T], int] | None = None) -> list[T]:
    """`waiting` (oldest first) in the order slots should go to them, given the slots each tenant already
    holds (`running`); `size_of`: the slots one item takes (a request for n choices takes n), 1 without it."""
    held = Counter(running or {})
    queues: dict[Hashable, deque[tuple[int, T]]] = {}
    weights: dict[Hashable, float] = {}
    for arrival, item in enumerate(waiting):
        tenant = tenant_of(item)
        queues.setdefault(tenant, deque()).append((arrival, item))
        weights.setdefault(tenant, max(weight_of(item), 1e-9))
    # (share, oldest waiting arrival, tenant): the lowest share first; between equals, who waited longest.
    heap = [(held[t] / weights[t], q[0][0], i, t) for i, (t, q) in enumerate(queues.items())]
    heapq.heapify(heap)
    order: list[T] = []
    while heap:
        _, _, i, tenant = heapq.heappop(heap)
        queue = queues[tenant]
        item = queue.popleft()[1]
        order.append(item)
        held[tenant] += size_of(item) if size_of is not None else 1
        if queue:
            heapq.heappush(heap, (held[tenant] / weights[tenant], queue[0][0], i, tenant))
    return order
