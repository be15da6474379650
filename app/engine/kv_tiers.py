"""A chat model's persistent KV tiers (app/kvstore), opened from its spec: the node's disk unless its entry turns it
off, and the cluster's store when it names one. Their key is the GGUF's content (its configured sha256, else its
checksum, read once per node in the background), the llama.cpp build, the context and the KV types."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import llama_cpp

from ..config.spec import ModelSpec
from ..kvstore.key import StoreKey, file_sha256
from ..kvstore.tier import DiskTier, StoreTier
from ..kvstore.tiers import TieredStore

KV_CACHE_ENV = "LLAMARAY_KV_CACHE"  # a node's default directory; "off": no disk tier unless an entry names one
DEFAULT_DIR = "~/.cache/llamaray/kv"
# How long an engine's start waits for its tiers' key and indexes (a checksum read before is instant; a new model's
# goes on in the background, and its first requests prefill meanwhile).
READY_WAIT_S = 10.0


def disk_dir(spec: ModelSpec) -> Path | None:
    """The node's directory for `spec`'s states (None: no disk tier)."""
    configured = spec.kv_disk_dir
    if configured == "":
        return None
    if configured is None:
        configured = os.environ.get(KV_CACHE_ENV) or DEFAULT_DIR
        if configured == "off":
            return None
    return Path(os.path.expandvars(os.path.expanduser(configured)))


def open_tiers(spec: ModelSpec, storage_options: dict[str, Any] | None = None) -> TieredStore | None:
    """The model's tiers, started (their key is found in the background); None when it keeps nothing beyond memory."""
    if not spec.keeps_prompt_kv:
        return None
    root = disk_dir(spec)
    tiers: list[Any] = []
    if root is not None:
        tiers.append(DiskTier(root, int(spec.kv_disk_mib * (1 << 20))))
    if spec.kv_store:
        tiers.append(StoreTier(spec.kv_store, storage_options))
    if not tiers:
        return None

    def key() -> StoreKey:
        model = spec.sha256 or file_sha256(spec.path, str(root) if root is not None else None)
        return StoreKey(model=model, engine=f"llama-cpp-python {llama_cpp.__version__}", n_ctx=spec.n_ctx,
                        type_k=spec.cache_type_k, type_v=spec.cache_type_v, flash_attn="auto")

    return TieredStore(tiers, key, min_tokens=spec.kv_min_tokens).start(wait_s=READY_WAIT_S)
