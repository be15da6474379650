"""What a key may reach: the one check of everything in a request that selects weights (its model, the adapter
its model names, its `lora` entries, the pooled model an admin route loads or pins), and of what `/v1/models` and
`/admin/models` list. Every route and service asks `may_use`; none matches ids on its own.

A policy's `models` names what the key may use, matched exactly (no prefixes, no case folding, no Unicode
normalising: a look-alike id is another id):

    models: [tiny]             # the model `tiny`, alone: none of its adapters, nor a model called `tiny:v2`
    models: ["tiny:support"]   # tiny's adapter `support` (requests naming it, and `lora` entries of it)
    models: ["tiny:*"]         # tiny and every adapter of it, as written out

A model's id may hold colons (Ollama's `name:tag`, a Hub `repo:quant`), so `tiny:v2` in a pool is a model of
its own, reached only when the policy names it; the config refuses a model id that would also name another
model's adapter, so an entry never means two things. A request that names adapters (any scale) needs each of
them allowed; one whose adapters all have scale 0 runs the base weights, so it needs the base allowed too."""

from __future__ import annotations

from collections.abc import Iterable

from .policies import KeyPolicy

ALL_ADAPTERS = "*"
"""`<model>:*` in a policy's `models`: the model and all its adapters."""


def may_use(policy: KeyPolicy | None, model: str, adapters: Iterable[tuple[str, float]] = ()) -> bool:
    """Whether `policy` allows base model `model` (a configured id) decoded under `adapters` ((name, scale)
    pairs; () is the base alone). None, or a policy without `models`: everything."""
    if policy is None or policy.models is None:
        return True
    allowed = policy.models
    everything = f"{model}:{ALL_ADAPTERS}" in allowed
    base_weights = True
    for name, scale in adapters:
        if not everything and f"{model}:{name}" not in allowed:
            return False
        base_weights = base_weights and scale == 0
    return not base_weights or everything or model in allowed
