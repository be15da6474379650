"""What a serve config asks of a cluster when every deployment runs its fewest replicas, summed, against
what the cluster has: `llamaray check-config`'s capacity check.

Per replica fit (app/ops/placement.py) says whether Ray can place a replica at all; this says whether it
can place all of them at once. Ray Serve starts every deployment's replicas together, so when the sum is
short some replica waits for resources forever (no autoscaler) and which one is Ray's choice.

What a replica asks: its Ray reservation (`replica_request`: CPU, GPU, custom resources), and for a model
that runs on the CPU its host memory, measured from its GGUF (the weights, counted once per file since
replicas on one node share the mapped pages, plus each replica's KV cache at n_ctx x n_seq_max in its KV types, f16 by default), its
speculative draft model's file and KV cache included.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..model_sources.gguf import read_metadata
from ..config.schema import ModelConfig
from ..config.spec import ModelSpec
from ..kvstore.tiers import MAX_QUEUED_BYTES

GIB = 1 << 30


@dataclass
class Ask:
    """One deployment's share: `replicas` (its fewest) times `request` (one replica's)."""

    deployment: str
    replicas: int
    request: dict[str, float]
    memory_note: str = ""  # how its memory was measured


@dataclass
class Capacity:
    """What a node or a cluster has; `source` says which and how that was learned."""

    resources: dict[str, float]
    source: str


def fewest_replicas(options: dict[str, Any]) -> int:
    """The replicas Serve starts a deployment with and keeps at least: autoscaling's min_replicas (or
    initial_replicas when larger), else num_replicas (Serve's default is 1; "auto" autoscales from 1)."""
    scaling = options.get("autoscaling_config")
    if isinstance(scaling, dict):
        least = int(scaling.get("min_replicas", 1))
        initial = scaling.get("initial_replicas")
        return max(least, int(initial)) if isinstance(initial, int) else least
    count = options.get("num_replicas", 1)
    return count if isinstance(count, int) else 1


# Bytes per element of each KV cache type (llama.cpp's block sizes: q8_0 34 bytes and q4_0 18 bytes per 32).
KV_TYPE_BYTES = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


def kv_cache_bytes(meta: dict[str, Any], n_ctx: int, n_seq_max: int, type_k: str = "f16", type_v: str = "f16") -> int:
    """llama.cpp's KV cache for `n_ctx` tokens per sequence and `n_seq_max` sequences in the model's KV types (f16
    by default): per layer, one key and one value row per token and KV head."""
    arch = meta.get("general.architecture", "")
    layers = int(meta.get(f"{arch}.block_count", 0))
    heads = int(meta.get(f"{arch}.attention.head_count", 0) or 0)
    kv_heads = meta.get(f"{arch}.attention.head_count_kv", heads)
    kv_heads = int(max(kv_heads) if isinstance(kv_heads, list) else kv_heads or heads)
    embd = int(meta.get(f"{arch}.embedding_length", 0))
    head_dim = embd // heads if heads else 0
    key = int(meta.get(f"{arch}.attention.key_length", head_dim))
    value = int(meta.get(f"{arch}.attention.value_length", head_dim))
    per_token = layers * kv_heads * (key * KV_TYPE_BYTES[type_k] + value * KV_TYPE_BYTES[type_v])
    return int(per_token * n_ctx * n_seq_max)


def gguf_memory(path: str, n_ctx: int, n_seq_max: int, type_k: str = "f16", type_v: str = "f16") -> tuple[int, int]:
    """(file bytes, KV cache bytes) of a local GGUF loaded at `n_ctx` per sequence x `n_seq_max` in those KV types."""
    return Path(path).stat().st_size, kv_cache_bytes(read_metadata(path), n_ctx, n_seq_max, type_k, type_v)


def local_gguf_files(spec: ModelSpec) -> list[str]:
    """The GGUFs a llama model's replica loads, when its file is on this machine: the model's, then its draft's
    for speculative decoding (a second context beside the model's, with its own weights and a KV cache of the
    same n_ctx x n_seq_max); [] when not measured here (a remote model not fetched yet)."""
    if spec.engine != "llama" or not spec.path or not Path(spec.path).is_file():
        return []
    draft = spec.speculative.draft_path if spec.speculative else ""
    return [spec.path, *([draft] if draft and Path(draft).is_file() else [])]


def host_cache_bytes(spec: ModelSpec) -> int:
    """Host memory a loaded model may take beyond its weights and KV: its prompt cache (prompt_cache_mib) and, with
    the KV tiers on, the states queued for writing to them (at most MAX_QUEUED_BYTES). Host memory on every node,
    also where the weights and KV are on a GPU; not in a pool's memory_budget_mib, which bounds its models' weights
    and KV (GPU memory on GPU nodes)."""
    if not spec.keeps_prompt_kv:
        return 0
    tiers_on = spec.kv_disk_dir != "" or bool(spec.kv_store)
    return int(spec.prompt_cache_mib * (1 << 20)) + (MAX_QUEUED_BYTES if tiers_on else 0)


def model_memory(spec: ModelSpec, cfg: ModelConfig, request: dict[str, float]) -> tuple[dict[str, int], int, str]:
    """({file: bytes} of the weights a replica maps, KV and host cache bytes per replica, note) of a model that
    runs on the host, its draft model's included; ({}, 0, why) when it is not measured here (it reserves a GPU, or
    its file is not on this machine)."""
    if request.get("GPU", 0) > 0:
        return {}, 0, "on a GPU: host memory not counted"
    paths = local_gguf_files(spec)
    if not paths:
        return {}, 0, "no local GGUF: memory not counted"
    files, kv = {}, host_cache_bytes(spec)
    for path in paths:
        files[path], cache = gguf_memory(path, cfg.n_ctx, cfg.n_seq_max, cfg.cache_type_k, cfg.cache_type_v)
        kv += cache
    return files, kv, ""


def total_asked(asks: list[Ask], weights: dict[str, int]) -> dict[str, float]:
    """The sum of every deployment's fewest replicas, plus each distinct model file once (as memory)."""
    total: dict[str, float] = {}
    for ask in asks:
        for key, value in ask.request.items():
            total[key] = total.get(key, 0.0) + ask.replicas * value
    if weights:
        total["memory"] = total.get("memory", 0.0) + sum(weights.values())
    return total


def _amount(key: str, value: float) -> str:
    return f"{value / GIB:.2f} GiB" if key == "memory" else f"{value:g}"


def capacity_problems(asks: list[Ask], weights: dict[str, int], capacity: Capacity,
                      front_door: tuple[str, ...] = ("Ingress", "ChatProcessor")) -> list[str]:
    """One line per resource the sum asks more of than `capacity` has, naming the sum, its parts and what
    is there."""
    total = total_asked(asks, weights)
    problems = []
    for key, asked in total.items():
        if key not in capacity.resources and key in ("memory", "object_store_memory"):
            continue  # not declared (a cluster file rarely states memory): nothing to compare with
        have = capacity.resources.get(key, 0.0)
        if asked <= have + 1e-9:
            continue
        parts = [f"{a.deployment} {a.replicas} x {_amount(key, a.request[key])}"
                 for a in asks if a.request.get(key)]
        if key == "memory" and weights:
            parts.append(f"model files {_amount(key, sum(weights.values()))}")
        line = (f"the deployments at their fewest replicas ask {_amount(key, asked)} {key} in all "
                f"({', '.join(parts)}), but {capacity.source} has {_amount(key, have)}: "
                f"some replicas would wait for resources that never come")
        door = [a for a in asks if a.deployment in front_door and a.request.get(key)]
        if key == "CPU" and door:
            line += (f"; and since Ray Serve starts every deployment's replicas together, the model replicas may "
                     f"take the CPUs first and leave {', '.join(a.deployment for a in door)} (the front door) "
                     f"unplaced: give them ray_actor_options.num_cpus: 0, as Serve's own proxy has")
        line += "; lower the models' num_cpus/n_threads or min_replicas, drop models, or add capacity"
        problems.append(line)
    return problems


# ---- what a node or a cluster has -------------------------------------------------------------------

def local_cpus() -> float:
    """The CPUs Ray would give this node: the CPUs this process may run on, capped by a cgroup v2 quota."""
    try:
        cpus = float(len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        cpus = float(os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1.0, float(quota) / float(period)))
    except (OSError, ValueError):
        pass
    return cpus


def local_gpus() -> float:
    """NVIDIA GPUs this node shows: CUDA_VISIBLE_DEVICES when set (as Ray reads it), else /dev/nvidiaN."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return float(len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"]))
    try:
        return float(sum(1 for name in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", name)))
    except OSError:
        return 0.0


def local_memory() -> float:
    """Physical memory (MemTotal) of this machine, in bytes; 0 when unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 0.0


def local_node() -> Capacity:
    resources = {"CPU": local_cpus(), "GPU": local_gpus(), "memory": local_memory()}
    if not resources["memory"]:
        del resources["memory"]
    return Capacity(resources, "this machine, one Ray node (the CPUs this process may run on, the NVIDIA GPUs "
                               "it shows, its physical memory)")


def cluster_capacity(cluster: dict[str, Any]) -> Capacity:
    """The most a cluster launcher file's cluster can have: its head plus every worker type at max_workers,
    by the `resources` each node type declares (memory from those too, when declared)."""
    node_types = cluster.get("available_node_types") or {}
    head = cluster.get("head_node_type")
    total: dict[str, float] = {}
    for name, node_type in node_types.items():
        if not isinstance(node_type, dict):
            continue
        count = 1 if name == head else int(node_type.get("max_workers", cluster.get("max_workers", 0)))
        for key, value in (node_type.get("resources") or {}).items():
            total[key] = total.get(key, 0.0) + count * float(value)
    return Capacity(total, "the cluster file at its largest (the head and every worker type at max_workers, by "
                           "the resources they declare)")
