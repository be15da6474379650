"""Reading Prometheus text exposition in graph tests: the lines of one series and their sum."""
from __future__ import annotations


def series(text: str, name: str) -> list[str]:
    """The sample lines of metric `name` (with labels), e.g. `ray_llamaray_pool_loads_total`."""
    return [ln for ln in text.splitlines() if ln.startswith(f"{name}{{")]


def total(lines: list[str]) -> float:
    """The sum of the samples' values: a counter across replicas and label sets."""
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines)
