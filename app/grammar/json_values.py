"""Small operations on decoded JSON values (dicts, lists, scalars)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def map_leaves(value: Any, fn: Callable[[Any], Any]) -> Any:
    """`value` with `fn` applied to every scalar in it; keys and structure stay as they are."""
    if isinstance(value, list):
        return [map_leaves(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: map_leaves(v, fn) for k, v in value.items()}
    return fn(value)
