"""Which model and LoRA adapters a generating request asks for: `model: "<base>:<adapter>"` (the adapter at
its configured scale) and llama-server's per-request `lora` list (adapters by index or name, with scales),
checked against the base model's configured adapters. The generation then goes to the base model's
replicas (every replica loads all its adapters at start) with the (name, scale) pairs its engine decodes
under (GenerationRequest.adapters).

An adapter the model does not have is a 404 `model_not_found`, as an unknown model is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..api.errors import APIError, invalid_request, model_not_found, served_model
from ..config.spec import ModelSpec
from ..tenants.access import may_use
from ..tenants.policies import KeyPolicy


@dataclass(frozen=True)
class Target:
    """A request's base model and the adapters it decodes under: (name, scale) pairs in the order of the
    model's `adapters`; () is the base model."""

    spec: ModelSpec
    adapters: tuple[tuple[str, float], ...] = ()

    @property
    def label(self) -> str:
        """The adapters in effect (non-zero scales), for metrics and traces; "" for the base model."""
        return ",".join(name for name, scale in self.adapters if scale != 0)


def split_model(models: Mapping[str, ModelSpec], model: str) -> tuple[ModelSpec, str | None] | None:
    """(spec, adapter name or None) for `model`: a configured id, or `<id>:<adapter>` of a configured adapter;
    None when it names neither. A model id may itself hold colons, so the id is what precedes the last one."""
    spec = models.get(model)
    if spec is not None:
        return spec, None
    base, sep, name = model.rpartition(":")
    spec = models.get(base) if sep else None
    if spec is not None and spec.adapter(name) is not None:
        return spec, name
    return None


def reached_model(models: Mapping[str, ModelSpec], model: str,
                  policy: KeyPolicy | None = None) -> tuple[ModelSpec, str | None]:
    """split_model's (spec, adapter or None) for `model`, when it is configured and the key's `policy` allows it
    (tenants/access.py); else the 404 of a model that does not exist."""
    found = split_model(models, model)
    if found is None or not may_use(policy, found[0].id, ((found[1], 1.0),) if found[1] else ()):
        raise model_not_found(model)
    return found


def served_target(models: Mapping[str, ModelSpec], model: str, kind: str, route: str,
                  lora: Sequence[Any] | None = None, policy: KeyPolicy | None = None) -> Target:
    """The request's target: `model` configured (else 404) and of `kind` (else 400, served_model's), its
    adapters from the `:adapter` suffix and the `lora` entries (which set the scales of the adapters they
    name, and add those they name besides). All of it must be what the key's `policy` allows
    (tenants/access.py): a model or adapter it may not use is answered as one that does not exist, and an
    adapter list names only the adapters it may use."""
    spec, suffix = reached_model(models, model, policy)
    served_model(models, spec.id, kind, route)
    visible = [a.name for a in spec.adapters if may_use(policy, spec.id, ((a.name, 1.0),))]
    scales: dict[str, float] = {}
    if suffix is not None:
        scales[suffix] = spec.adapter(suffix).scale  # type: ignore[union-attr]
    seen: set[str] = set()
    for i, entry in enumerate(lora or ()):
        name = _entry_adapter(spec, entry, i, visible)
        if name in seen:
            raise invalid_request(f"Adapter `{name}` is named twice in `lora`.", param=f"lora[{i}]",
                                  code="invalid_value")
        seen.add(name)
        scales[name] = entry.scale if entry.scale is not None else spec.adapter(name).scale  # type: ignore[union-attr]
    target = Target(spec, tuple((a.name, scales[a.name]) for a in spec.adapters if a.name in scales))
    if not may_use(policy, spec.id, target.adapters):  # every adapter at scale 0: the base model's weights
        raise model_not_found(model)
    return target


def _entry_adapter(spec: ModelSpec, entry: Any, i: int, visible: list[str]) -> str:
    """The name of the adapter a `lora` entry means: by index (`id`, in the model's `adapters`) or `name`, both the
    same when both are given; one not in `visible` (those the key may use) is unknown."""
    by_id = by_name = None
    if entry.id is not None:
        if entry.id >= len(spec.adapters) or spec.adapters[entry.id].name not in visible:
            raise _unknown(spec, f"`lora[{i}].id` {entry.id} names no adapter of model `{spec.id}`",
                           f"lora[{i}].id", visible)
        by_id = spec.adapters[entry.id].name
    if entry.name is not None:
        if entry.name not in visible:
            raise _unknown(spec, f"model `{spec.id}` has no adapter `{entry.name}`", f"lora[{i}].name", visible)
        by_name = entry.name
    if by_id is not None and by_name is not None and by_id != by_name:
        raise invalid_request(f"`lora[{i}]` names adapter {entry.id} (`{by_id}`) and `{by_name}`: name one.",
                              param=f"lora[{i}]", code="invalid_value")
    return by_id or by_name  # type: ignore[return-value]


def _unknown(spec: ModelSpec, what: str, param: str, visible: list[str]) -> APIError:
    """An adapter the request names that does not exist (or that the key may not use: told apart from nothing)."""
    ids = ", ".join(f"{i} `{a.name}`" for i, a in enumerate(spec.adapters) if a.name in visible) or "none"
    return APIError(f"The adapter does not exist: {what} (its adapters: {ids}).", param=param,
                    code="model_not_found", status=404, type="invalid_request_error")
