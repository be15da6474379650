"""Python's cyclic garbage collector in a serving replica: a young collection after 20,000 net allocations of
containers instead of Python's 700.

A replica streaming at GPU speed holds a few thousand short-lived containers at any moment (the chunks' dicts,
futures and coroutine frames of hundreds of streams), which reference counting frees within milliseconds. At
Python's threshold the collector still runs whenever 700 of them are alive at once, a dozen times a second, and
what survives ages into full collections over everything the replica keeps, each holding its event loop and the
GIL for tens of milliseconds (docs/history/benchmarks-2026.md, "The garbage collector was a sixth of the Ingress"). Reference
cycles, which the collector is for, are still collected: once 20,000 more containers have been made than freed,
so young cyclic garbage is bounded by that many objects.

Ray Serve freezes what a replica allocated while starting (gc.freeze after its constructor) and keeps Python's
thresholds. Its proxy, every chunk's hop when clients call it (serve_config.yaml), reads its own young threshold
from the node's environment when it starts (RAY_SERVE_PROXY_GC_THRESHOLD, also 700): PROXY_ENV, which `serve-local`,
the KubeRay manifest and cluster.yaml's `ray start` set.
"""

from __future__ import annotations

import gc
from typing import Any

YOUNG_THRESHOLD = 20_000
PROXY_ENV = {"RAY_SERVE_PROXY_GC_THRESHOLD": str(YOUNG_THRESHOLD)}


def tune_for_serving(young: int = YOUNG_THRESHOLD) -> None:
    """This process collects its young generation after `young` net allocations; the older generations' ratios
    stay as they are."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, old)


def gc_info() -> dict[str, Any]:
    """The collector's thresholds and the collections each generation has run (replica_info: tests, operators)."""
    return {"threshold": list(gc.get_threshold()), "collections": [s["collections"] for s in gc.get_stats()]}
