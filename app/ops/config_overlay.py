"""Merge a small overlay onto serve_config.yaml, so local runs reuse the production graph.

Mappings merge key by key; lists of mappings merge item by item on their identity key (`name`
for applications and deployments, `id` for models); any other value is replaced.
"""

from __future__ import annotations

import copy
from typing import Any

from ..config.spec import deployment_name

IDENTITY_KEYS = ("name", "id")


def _identity(item: Any) -> tuple[str, Any] | None:
    if isinstance(item, dict):
        for key in IDENTITY_KEYS:
            if key in item:
                return key, item[key]
    return None


def merge(base: Any, overlay: Any) -> Any:
    if isinstance(base, dict) and isinstance(overlay, dict):
        out = copy.deepcopy(base)
        for key, value in overlay.items():
            out[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(overlay, list) and all(_identity(i) for i in overlay):
        out = copy.deepcopy(base)
        index = {_identity(item): n for n, item in enumerate(out)}
        for item in overlay:
            ident = _identity(item)
            if ident in index:
                out[index[ident]] = merge(out[index[ident]], item)
            else:
                out.append(copy.deepcopy(item))
        return out
    return copy.deepcopy(overlay)


def without_unused_deployments(config: dict[str, Any]) -> dict[str, Any]:
    """The config with the blocks of deployments an application does not have: with `topology: single` only
    the Ingress exists (no ChatProcessor, no model deployments). Serve refuses a block for a deployment
    that does not exist."""
    out = copy.deepcopy(config)
    for app in out.get("applications") or []:
        args = app.get("args") or {}
        if args.get("topology") != "single" or not app.get("deployments"):
            continue
        unused = {"ChatProcessor", *(deployment_name(str(m.get("id"))) for m in args.get("models") or []),
                  *(f"LlamaPool-{p.get('name')}" for p in args.get("pools") or [] if isinstance(p, dict))}
        app["deployments"] = [d for d in app["deployments"] if d.get("name") not in unused]
    return out
