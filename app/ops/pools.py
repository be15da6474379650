"""A pool as the operator plans it: each model's memory measured from its GGUF (the file plus its KV cache at
n_ctx x n_seq_max, its draft model's too, as check-config's capacity sum measures a model), the plan its
replicas get, the pool deployment's default options, and check-config's problems (a model over the budget,
pinned models that do not fit together)."""

from __future__ import annotations

import math
from typing import Any

from ..config.app_args import AppArgs
from ..config.schema import ModelConfig, PoolConfig
from ..config.spec import ModelSpec
from ..model_sources.gguf import GGUFError
from ..pools.plan import MIB, PoolPlan, mib
from .capacity import gguf_memory, local_gguf_files
from ..routing.prefix_routing import router_kwargs
from .placement import DEFAULT_MAX_REPLICAS, POOL_ROUTER_CLASS, fits, ingress_hosting_defaults


def pool_deployment_name(pool: str) -> str:
    """Name of a pool's deployment, as written in serve_config.yaml's `deployments:`."""
    return f"LlamaPool-{pool}"


def model_need(spec: ModelSpec) -> int:
    """Bytes a model takes loaded: its GGUF's size plus its KV cache, and its draft model's; 0 when its file is
    not here (a remote model not fetched yet: not measured)."""
    try:
        return sum(sum(gguf_memory(path, spec.n_ctx, spec.n_seq_max, spec.cache_type_k, spec.cache_type_v))
                   for path in local_gguf_files(spec))
    except (GGUFError, OSError):
        return 0


def pool_plan(pool: PoolConfig, specs: list[ModelSpec]) -> PoolPlan:
    budget = int(pool.memory_budget_mib * MIB) if pool.memory_budget_mib else None
    return PoolPlan(pool.name, pool.max_models, budget, tuple(dict.fromkeys(pool.pinned)), pool.idle_unload_s,
                    pool.failed_load_retry_s, {s.id: model_need(s) for s in specs if s.pool == pool.name},
                    pool.room_wait_s, pool.claim_after_s)


def pool_plans(args: AppArgs, specs: list[ModelSpec]) -> list[PoolPlan]:
    return [pool_plan(pool, specs) for pool in args.pools]


def pool_problems(plan: PoolPlan) -> list[str]:
    """A model larger than the budget can never load; pinned models that do not fit together neither."""
    if plan.budget_bytes is None:
        return []
    out = [f"pool {plan.name!r}: model {m!r} needs {mib(n)} (its GGUF plus its KV cache at n_ctx x n_seq_max, "
           f"a draft model's included), more than the pool's memory_budget_mib ({mib(plan.budget_bytes)}): it "
           f"could never load; raise the budget, or lower its n_ctx or n_seq_max"
           for m, n in plan.needs.items() if n > plan.budget_bytes]
    pinned = sum(plan.needs.get(m, 0) for m in plan.pinned)
    if pinned > plan.budget_bytes:
        out.append(f"pool {plan.name!r}: its pinned models ({', '.join(plan.pinned)}) need {mib(pinned)} together, "
                   f"more than its memory_budget_mib ({mib(plan.budget_bytes)})")
    return out


def replica_need(plan: PoolPlan) -> tuple[int, str]:
    """(bytes, how) the models one replica of the pool may hold at once take at most: its `max_models` largest
    models together, or its memory budget when that is less (a replica never goes past it)."""
    largest = sorted(plan.needs.items(), key=lambda kv: -kv[1])[:plan.max_models]
    most = sum(n for _, n in largest)
    how = f"max_models {plan.max_models}: its largest models {', '.join(m for m, _ in largest)} at once"
    if plan.budget_bytes is not None and plan.budget_bytes < most:
        return plan.budget_bytes, f"its memory_budget_mib; {how} would take {mib(most)}"
    return most, how


# A cluster file's node type states the memory of each of its GPUs as this label (MiB, a string as Ray's labels
# are): Ray counts GPUs, not their memory, so a GPU pool is weighed against it only where declared.
GPU_MEMORY_LABEL = "llamaray.io/gpu-memory-mib"
GPU_MEMORY = "gpu_memory"  # a node's key, in pool_node_problems' `nodes`: bytes of each GPU


def pool_node_problems(plan: PoolPlan, request: dict[str, float], nodes: dict[str, dict[str, float]],
                       where: str) -> list[str]:
    """A pool whose replica could hold more than the memory of every node it can be placed on (by its CPU, GPU
    and custom resources): it would load models until the node runs out of memory. `nodes`: node name ->
    resources (memory in bytes, as Ray counts it; GPU_MEMORY, each GPU's bytes, where stated). A pool that
    reserves GPUs keeps its models in VRAM: weighed against the GPU memory the replica gets (its num_gpus of
    the node's GPUs; a fraction of one GPU, that share of it); nodes that state no such memory are not judged."""
    if not plan.needs:
        return []
    gpus = request.get("GPU", 0)
    key = GPU_MEMORY if gpus > 0 else "memory"
    placed = {name: res for name, res in nodes.items()
              if fits({k: v for k, v in request.items() if k != "memory"}, res) and res.get(key)}
    room = {name: res[key] * gpus if gpus > 0 else res[key] for name, res in placed.items()}
    need, how = replica_need(plan)
    if not room or need <= max(room.values()):
        return []
    if gpus > 0:
        shown = ", ".join(f"{name} {mib(room[name])} ({gpus:g} x {mib(res[key])} GPU)" for name, res in placed.items())
        return [f"pool {plan.name!r}: a replica may hold {mib(need)} ({how}; each model's GGUF plus its KV cache at "
                f"n_ctx x n_seq_max, in GPU memory), more than the GPU memory it gets on any node it can be placed "
                f"on ({where}: {shown}): its loads would fail out of GPU memory; set memory_budget_mib below it, "
                f"lower max_models, or give each replica more or larger GPUs (ray_actor_options.num_gpus)"]
    shown = ", ".join(f"{name} {mib(res['memory'])}" for name, res in placed.items())
    return [f"pool {plan.name!r}: a replica may hold {mib(need)} ({how}; each model's GGUF plus its KV cache at "
            f"n_ctx x n_seq_max), more than the memory of any node it can be placed on ({where}: {shown}): it "
            f"would run the node out of memory; set memory_budget_mib below the node's memory, lower max_models, "
            f"or place the pool on nodes with more memory"]


# A pool replica's max_ongoing_requests per slot of the models it holds (pool_deployment_defaults says why).
POOL_ONGOING_PER_SLOT = 2
# Seconds between a pool replica's reports of its room (LlamaPool.record_routing_stats): one actor call a second.
ROOM_STATS_PERIOD_S = 1.0


def pool_deployment_defaults(pool: PoolConfig, models: list[ModelConfig]) -> dict[str, Any]:
    """Options of `LlamaPool-<name>` without a block of its own, as a model deployment's
    (placement.model_deployment_defaults): CPUs for the most threads one of its models runs (loaded models
    share them), slots of max_models models, autoscaling between 1 and DEFAULT_MAX_REPLICAS replicas at about
    3/4 of one model's slots busy. Requests go to the replicas that hold their model (Serve's multiplexed
    routing) and, among those, to the one most likely holding their prompt's prefix (the pool router,
    deployments/prefix_router.py), bounded like a model deployment's by one replica's slots."""
    members = [m for m in models if m.pool == pool.name]
    threads = max((m.n_threads or 1 for m in members), default=1)
    slots = max((m.n_seq_max for m in members), default=4)
    gpu = any(m.n_gpu_layers not in (None, 0) for m in members)
    n_ctx = max((m.n_ctx for m in members), default=4096)
    return {
        # Twice its models' slots: one replica's cap is shared by the models it holds, and at the bare sum a popular
        # model's queued requests fill it, so its replica-mates' requests wait in Serve's queue behind them (not
        # for a slot of their own model). The engines queue the extra requests per model (docs/benchmarks.md).
        "max_ongoing_requests": slots * pool.max_models * POOL_ONGOING_PER_SLOT,
        "autoscaling_config": {"min_replicas": 1, "max_replicas": DEFAULT_MAX_REPLICAS,
                               "target_ongoing_requests": max(1, math.ceil(slots * 3 / 4))},
        "ray_actor_options": {"num_cpus": float(threads), "num_gpus": 1 if gpu else 0},
        "request_router_config": {
            "request_router_class": POOL_ROUTER_CLASS,
            "request_router_kwargs": router_kwargs(slots * pool.max_models, n_ctx,
                                                   any(m.kv_cache.disk for m in members if m.kind == "chat")),
            # How fresh the router's view of each replica's room for a cold model is (Serve's default: 10 s,
            # longer than a request here).
            "request_routing_stats_period_s": ROOM_STATS_PERIOD_S,
        },
    }


def single_hosting_defaults(args: AppArgs) -> dict[str, Any]:
    """The Ingress's options with `topology: single`: what the models of their own deployments would reserve
    (placement.ingress_hosting_defaults), plus each pool's one replica."""
    options = ingress_hosting_defaults([m for m in args.models if not m.pool])
    actor = options["ray_actor_options"]
    for pool in args.pools:
        extra = pool_deployment_defaults(pool, args.models)["ray_actor_options"]
        actor["num_cpus"] += extra["num_cpus"]
        actor["num_gpus"] += extra["num_gpus"]
    return options
