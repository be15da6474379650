"""Where replicas run, as plain data: the deployment options the builder derives from a model entry,
how a serve config's `deployments:` block applies on top of them, and whether a replica's resource
request fits a node. Used by the builder, `llamaray check-config` and the Ingress's placement watch;
the Ray facts (cluster nodes, Serve's deployment details) are gathered in deployments/.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from ..config.schema import ModelConfig
from ..routing.prefix_routing import router_kwargs

# Code defaults of the two CPU deployments (their @serve.deployment decorators use these). The front door
# reserves no CPU, as Serve's own proxy and controller: Ray Serve starts every deployment's replicas together
# (models first: a graph's leaves are deployed before its root), so on a node the models fill, any CPU the
# front door asked for could be taken first and leave /health and every model unreachable. A 0-CPU actor
# is placed on any live node. Its real use (docs/history/benchmarks-2026.md) is sized by leaving CPUs free.
INGRESS_DEFAULTS: dict[str, Any] = {"ray_actor_options": {"num_cpus": 0}, "max_ongoing_requests": 256}
CHAT_PROCESSOR_DEFAULTS: dict[str, Any] = {"ray_actor_options": {"num_cpus": 0}, "max_ongoing_requests": 256}
CORE_DEPLOYMENTS = {"Ingress": INGRESS_DEFAULTS, "ChatProcessor": CHAT_PROCESSOR_DEFAULTS}

# A model deployment without its own block scales between 1 and this many replicas.
DEFAULT_MAX_REPLICAS = 4
# The model deployments' request router (deployments/prefix_router.py) for `routing: prefix`, by the
# import path Ray Serve resolves (a string: app/ never imports ray or deployments/).
PREFIX_ROUTER_CLASS = "deployments.prefix_router:PrefixAffinityRouter"
# A pool's: Serve's multiplexed choice (the replicas holding the model), then the prefix choice among them.
POOL_ROUTER_CLASS = "deployments.prefix_router:PoolAffinityRouter"
# What Ray Serve reserves for a replica whose ray_actor_options name no num_cpus.
RAY_DEFAULT_NUM_CPUS = 1.0

LOCAL_HINT = ("without a GPU, run `make run`, or serve the CPU overlay: `llamaray render-config serve_config.yaml "
              "--overlay configs/local-cpu.yaml -o build/serve_local.yaml` then `serve run build/serve_local.yaml`")


def offloads(cfg: ModelConfig) -> bool:
    """The model entry asks llama.cpp for GPU layers explicitly (auto and 0 do not)."""
    return cfg.n_gpu_layers is not None and cfg.n_gpu_layers != 0


def model_deployment_defaults(cfg: ModelConfig) -> dict[str, Any]:
    """Options of `LlamaModel-<id>` when the serve config has no block for it (or leaves a key out).

    - a GPU (`num_gpus: 1`) only when `n_gpu_layers` is set and not 0. With `n_gpu_layers` left at auto
      nothing reserves a GPU, so the replica runs on the CPU: state the GPU in the config (as
      serve_config.yaml does) rather than have every model buy one;
    - `num_cpus`: `n_threads` when set, else 1 (and the replica then runs 1 thread);
    - `max_ongoing_requests` = `n_seq_max` (the slots), so extra requests wait in Serve's queue;
    - autoscaling between 1 and DEFAULT_MAX_REPLICAS replicas at about 3/4 of the slots busy;
    - with `routing: prefix` (the default), the prefix-aware request router, its records bounded by
      what one replica's slots hold (`n_seq_max` prompts of `n_ctx` tokens). Always, not only when
      `max_replicas` > 1: autoscaling adds replicas at run time, and with one replica the router
      costs a hash of the prompt per request (it skips the choice itself); where the model keeps states on
      its nodes' disks (`kv_cache.disk`, the default), per-node records too. Not for an embedding model: its
      requests reuse no KV, so Serve's load balancing serves them.
    """
    options: dict[str, Any] = {
        "max_ongoing_requests": cfg.n_seq_max,
        "autoscaling_config": {"min_replicas": 1, "max_replicas": DEFAULT_MAX_REPLICAS,
                               "target_ongoing_requests": max(1, math.ceil(cfg.n_seq_max * 3 / 4))},
        "ray_actor_options": {"num_cpus": float(cfg.n_threads or 1), "num_gpus": 1 if offloads(cfg) else 0},
    }
    if cfg.routing == "prefix" and cfg.kind == "chat":  # an embedding request has no prefix to reuse
        options["request_router_config"] = {
            "request_router_class": PREFIX_ROUTER_CLASS,
            "request_router_kwargs": router_kwargs(cfg.n_seq_max, cfg.n_ctx, cfg.kv_cache.disk),
        }
    return options


def ingress_hosting_defaults(cfgs: list[ModelConfig]) -> dict[str, Any]:
    """Options of the Ingress when it runs the models' engines itself (`llama_model: ingress`): it reserves
    what their LlamaModel replicas would (model_deployment_defaults) on top of its own."""
    cpus = INGRESS_DEFAULTS["ray_actor_options"]["num_cpus"]
    gpus = 0
    for cfg in cfgs:
        actor = model_deployment_defaults(cfg)["ray_actor_options"]
        cpus += actor["num_cpus"]
        gpus += actor["num_gpus"]
    return {**copy.deepcopy(INGRESS_DEFAULTS), "ray_actor_options": {"num_cpus": cpus, "num_gpus": gpus}}


def apply_block(defaults: dict[str, Any], block: dict[str, Any] | None) -> dict[str, Any]:
    """Options as Ray Serve applies a config file's deployment block onto the code's: each key the
    block names replaces the code's value whole (a `ray_actor_options` block without `num_gpus` reserves
    no GPU, whatever the code said); keys it leaves out keep the code's value."""
    out = copy.deepcopy(defaults)
    for key, value in (block or {}).items():
        if key != "name":
            out[key] = copy.deepcopy(value)
    return out


def replica_request(options: dict[str, Any]) -> dict[str, float]:
    """The resources one replica reserves, from its deployment options (Ray Serve's defaults filled in)."""
    actor = options.get("ray_actor_options") or {}
    request = {"CPU": float(actor.get("num_cpus", RAY_DEFAULT_NUM_CPUS)), "GPU": float(actor.get("num_gpus", 0))}
    request.update({k: float(v) for k, v in (actor.get("resources") or {}).items()})
    return {k: v for k, v in request.items() if v > 0}


def fits(request: dict[str, float], resources: dict[str, float]) -> bool:
    return all(resources.get(k, 0) >= v for k, v in request.items())


def _fmt(value: float) -> str:
    return f"{value:g}"


def missing(request: dict[str, float], nodes: list[dict[str, float]]) -> str:
    """What no node has, in words: 'GPU 1 (the most any node has: 0)', or the combination when each
    resource exists somewhere but never all on one node."""
    short = [f"{k} {_fmt(v)} (the most any node has: {_fmt(max((n.get(k, 0) for n in nodes), default=0))})"
             for k, v in request.items() if all(n.get(k, 0) < v for n in nodes)]
    if short:
        return ", ".join(short)
    return "all of " + ", ".join(f"{k} {_fmt(v)}" for k, v in request.items()) + " on one node"


def unplaceable_message(model_id: str, deployment: str, request: dict[str, float],
                        nodes: list[dict[str, float]]) -> str | None:
    """Why `deployment`'s replicas cannot be placed on any of `nodes` (their total resources), when no
    autoscaler can add a node; None if some node could hold one."""
    if any(fits(request, n) for n in nodes):
        return None
    asks = ", ".join(f"{k}: {_fmt(v)}" for k, v in request.items())
    return (f"model {model_id!r} cannot be placed: each {deployment} replica reserves {{{asks}}}, and no node of "
            f"this Ray cluster ({len(nodes)} node{'s' if len(nodes) != 1 else ''}) has {missing(request, nodes)}, "
            f"and no autoscaler can add one. On a cluster, add a node type that has it (cluster.yaml); "
            f"{LOCAL_HINT}")


def waiting_message(model_id: str, deployment: str, request: dict[str, float], nodes: list[dict[str, float]],
                    free: list[dict[str, float]]) -> str:
    """Why `deployment`'s replica waits: some node could hold it (`nodes`, their totals) but none has its
    request free (`free`): the other replicas hold it, and no autoscaler can add a node."""
    asks = ", ".join(f"{k}: {_fmt(v)}" for k, v in request.items())
    short = [f"{k} {_fmt(v)} (the most free on a node: {_fmt(max((n.get(k, 0) for n in free), default=0))} of "
             f"{_fmt(max((n.get(k, 0) for n in nodes), default=0))})"
             for k, v in request.items() if all(n.get(k, 0) < v for n in free)]
    missing_now = ", ".join(short) if short else "all of " + ", ".join(f"{k} {_fmt(v)}" for k, v in request.items()) + " free on one node"
    return (f"model {model_id!r} cannot be placed: each {deployment} replica reserves {{{asks}}}, and no node of "
            f"this Ray cluster has {missing_now}: the replicas already placed hold the rest, and no autoscaler can "
            f"add a node. The config asks more than the cluster has (`llamaray check-config` sums it): lower the "
            f"models' num_cpus (n_threads) or min_replicas, serve fewer models, or add a node")
