"""Model names as Ollama clients send them, and as /api/tags lists ours: one rule, in this one place.

Ollama names a model `name:tag`, the tag `latest` when none is given, and its clients send back the names
/api/tags listed. A request's name is resolved to a configured id thus:

1. the name as it is, when it is a configured id (`smollm2`, `tiny:v2`) or a LoRA adapter's card
   (`<base>:<adapter>`: an adapter is a tag of its base model);
2. else, when it ends in `:latest`, the name without that tag (`smollm2:latest` is `smollm2`);
3. else nothing: a 404 in Ollama's shape, as for a model the key may not use (app/tenants/access.py: another
   key's model and a missing one answer alike).

/api/tags lists an id that has no tag as `<id>:latest` (the name Ollama would give it, which rule 2 brings back),
unless `<id>:latest` is itself configured; an id with a colon is listed as it is."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TypeVar

from ..config.spec import ModelSpec
from ..generation.adapters import split_model
from ..generation.caller import Caller
from ..tenants.access import may_use
from .errors import model_not_found

R = TypeVar("R")

LATEST = ":latest"


def resolve_name(name: str, known: Callable[[str], bool]) -> str | None:
    """The configured id `name` means, by the rule above; `known(id)`: whether `id` is configured and the caller's
    to use (tenants/access.py). None: no model of that name for this caller."""
    if known(name):
        return name
    if name.endswith(LATEST):
        bare = name[:-len(LATEST)]
        if bare and known(bare):
            return bare
    return None


def listed_name(model_id: str, ids: Collection[str]) -> str:
    """How /api/tags and /api/ps name `model_id` among the configured `ids`."""
    if ":" in model_id or f"{model_id}{LATEST}" in ids:
        return model_id
    return f"{model_id}{LATEST}"


def resolve_request(req: R, known: Callable[[str], bool]) -> R:
    """`req` (an Ollama request: `model`, `name`, `with_model`) naming the configured id its name means; Ollama's
    404 when it means none the caller may use."""
    model_id = resolve_name(req.model, known)  # type: ignore[attr-defined]
    if model_id is None:
        raise model_not_found(req.name)  # type: ignore[attr-defined]
    return req.with_model(model_id)  # type: ignore[attr-defined]


def resolved(models: dict[str, ModelSpec], req: R, caller: Caller) -> R:
    """`resolve_request` where the specs are known (the processing; the Ingress asks its model cards): an id is
    known when it names a configured model or one of its adapters and the caller's key may use it."""
    def known(name: str) -> bool:
        found = split_model(models, name)
        return found is not None and may_use(caller.policy, found[0].id, ((found[1], 1.0),) if found[1] else ())

    return resolve_request(req, known)
