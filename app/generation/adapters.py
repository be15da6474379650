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
from ..config.settings import ModelSpec


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


def served_target(models: Mapping[str, ModelSpec], model: str, kind: str, route: str,
                  lora: Sequence[Any] | None = None) -> Target:
    """The request's target: `model` configured (else 404) and of `kind` (else 400, served_model's), its
    adapters from the `:adapter` suffix and the `lora` entries (which set the scales of the adapters they
    name, and add those they name besides)."""
    found = split_model(models, model)
    if found is None:
        raise model_not_found(model)
    spec, suffix = found
    served_model(models, spec.id, kind, route)
    scales: dict[str, float] = {}
    if suffix is not None:
        scales[suffix] = spec.adapter(suffix).scale  # type: ignore[union-attr]
    seen: set[str] = set()
    for i, entry in enumerate(lora or ()):
        name = _entry_adapter(spec, entry, i)
        if name in seen:
            raise invalid_request(f"Adapter `{name}` is named twice in `lora`.", param=f"lora[{i}]",
                                  code="invalid_value")
        seen.add(name)
        scales[name] = entry.scale if entry.scale is not None else spec.adapter(name).scale  # type: ignore[union-attr]
    return Target(spec, tuple((a.name, scales[a.name]) for a in spec.adapters if a.name in scales))


def _entry_adapter(spec: ModelSpec, entry: Any, i: int) -> str:
    """The name of the adapter a `lora` entry means: by index (`id`) or `name`, both the same when both are given."""
    by_id = by_name = None
    if entry.id is not None:
        if entry.id >= len(spec.adapters):
            raise _unknown(spec, f"`lora[{i}].id` is {entry.id}; model `{spec.id}` has "
                                 f"{len(spec.adapters)} adapter{'' if len(spec.adapters) == 1 else 's'}",
                           f"lora[{i}].id")
        by_id = spec.adapters[entry.id].name
    if entry.name is not None:
        if spec.adapter(entry.name) is None:
            raise _unknown(spec, f"model `{spec.id}` has no adapter `{entry.name}`", f"lora[{i}].name")
        by_name = entry.name
    if by_id is not None and by_name is not None and by_id != by_name:
        raise invalid_request(f"`lora[{i}]` names adapter {entry.id} (`{by_id}`) and `{by_name}`: name one.",
                              param=f"lora[{i}]", code="invalid_value")
    return by_id or by_name  # type: ignore[return-value]


def _unknown(spec: ModelSpec, what: str, param: str) -> APIError:
    names = ", ".join(f"`{a.name}`" for a in spec.adapters) or "none"
    return APIError(f"The adapter does not exist: {what} (its adapters: {names}).", param=param,
                    code="model_not_found", status=404, type="invalid_request_error")
