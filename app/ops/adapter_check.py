"""A model's LoRA adapters checked against its GGUF before anything is deployed: app/engine/lora's own checks
(the adapter's type, architecture, and every tensor pair's shapes against the base's tensor table), so an
adapter made for another base is a config error naming both, at build (deployments/builder.py) and by
`llamaray check-config`, not a replica that starts without it.

An adapter or a base that is remote is checked by each replica as it loads it (the same checks,
LlamaEngine.load_adapter): the builder reads no more of a remote file than its header.
"""

from __future__ import annotations

from ..config.schema import ConfigError
from ..config.spec import ModelSpec
from ..engine.lora import AdapterMismatch, BaseTensors, check_adapter
from ..model_sources.gguf import GGUFError


def check_adapters(spec: ModelSpec) -> None:
    """ConfigError (naming the model and the adapter) unless each local adapter fits the local base."""
    local = [a for a in spec.adapters if a.path]
    if not local or not spec.path:
        return
    try:
        base = BaseTensors.read(spec.id, spec.path)
    except (GGUFError, OSError) as exc:
        raise ConfigError(f"model {spec.id!r}: cannot read the tensor table of {spec.path} to check its "
                          f"adapters: {exc}") from None
    for adapter in local:
        try:
            check_adapter(adapter.name, adapter.path, base)
        except AdapterMismatch as exc:
            raise ConfigError(f"model {spec.id!r}: {exc}") from None


def deferred_adapters(spec: ModelSpec) -> list[str]:
    """The adapters checked only by the replicas (a remote adapter, or any adapter of a remote base)."""
    return [a.name for a in spec.adapters if not a.path or not spec.path]
