"""`llamaray check-config`: the whole serve config file, not only its args, one line per problem.

Per application: the args as the builder validates them (models resolved, templates checked; where each
model comes from and whether a remote GGUF's header was readable goes to `notes`); then each
`deployments:` block against the models (a name that matches none; a model that offloads layers to a GPU
its deployment does not reserve, or reserves a GPU it keeps no layer on; more ongoing requests than the
model has slots; a `num_replicas` that the builder's autoscaling default overrides; a `request_router_config`
that drops the prefix-aware router without saying so); given a cluster launcher file, whether one replica
of each deployment fits at least one of its node types; and, given a capacity (the local node, or the cluster
file at its largest), whether every application's deployments at their fewest replicas fit it together
(app/ops/capacity.py).
"""

from __future__ import annotations

import math
from typing import Any

from ..config.app_args import parse_args
from ..config.resolution import resolve_model
from ..config.schema import ConfigError, ModelConfig
from ..config.spec import ModelSpec, deployment_name
from ..config.pools import catalogue_entries
from ..model_sources.redact import redacted
from .adapter_check import check_adapters, deferred_adapters
from .capacity import Ask, Capacity, capacity_problems, fewest_replicas, model_memory
from .placement import (
    CORE_DEPLOYMENTS,
    PREFIX_ROUTER_CLASS,
    apply_block,
    fits,
    model_deployment_defaults,
    offloads,
    replica_request,
)
from .pools import (
    GPU_MEMORY,
    GPU_MEMORY_LABEL,
    pool_deployment_defaults,
    pool_deployment_name,
    pool_node_problems,
    pool_plan,
    pool_problems,
    single_hosting_defaults,
)
from ..routing.prefix_routing import ROUTER_KWARGS, router_kwargs_problem
from ..prompt.preflight import preflight


LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def check_config(config: dict[str, Any], cluster: dict[str, Any] | None = None,
                 notes: list[str] | None = None, capacity: Capacity | None = None) -> list[str]:
    """The problems, one line each; `notes` (when given) gets one line per model saying where it comes from.
    With `capacity`, the sum of what every application asks at its fewest replicas must fit it."""
    problems = []
    asks: list[Ask] = []
    weights: dict[str, int] = {}
    host = str((config.get("http_options") or {}).get("host", "127.0.0.1"))  # Serve's default: loopback
    for app in config.get("applications") or []:
        name = app.get("name", "?")
        app_notes: list[str] = []
        problems += [f"{name}: {line}" for line in check_application(app, cluster, app_notes, asks, weights,
                                                                     capacity)]
        if notes is not None:
            notes += [f"{name}: {line}" for line in app_notes]
        if host not in LOOPBACK and not _requires_keys(app):
            problems.append(f"{name}: serves on {host} (beyond this machine) without `auth.required: true`: "
                            f"anyone who reaches the port could use the models; require keys (and give the "
                            f"replicas LLAMARAY_API_KEYS), or bind 127.0.0.1")
    if capacity is not None:
        problems += capacity_problems(asks, weights, capacity)
    return problems


def source_note(model: ModelConfig, spec: ModelSpec) -> str:
    """What a model serves and where it (and its projector) come from, and where the builder found its
    metadata."""
    if spec.engine == "synthetic":
        return f"model {model.id!r}: synthetic engine (no file)"
    name = f"model {model.id!r} ({spec.kind})"
    projector = (f"; images through the projector {redacted(spec.mmproj_source or spec.mmproj_path)}"
                 if spec.mmproj_source or spec.mmproj_path else "")
    if spec.adapters:
        deferred = deferred_adapters(spec)
        projector += (f"; LoRA adapters {', '.join(a.name for a in spec.adapters)}"
                      + (f" ({', '.join(deferred)} checked against the model by each replica as it loads them)"
                         if deferred else " (checked against the model)"))
    if not spec.source:
        return f"{name}: {spec.path} (a file every node that runs it must have; metadata read from it){projector}"
    header = ("header read by range requests" if spec.metadata_from == "header"
              else f"header NOT readable ({spec.metadata_note}); the configured chat_template is used")
    return (f"{name}: {redacted(spec.source)} (fetched by each node that runs it, into its model cache); "
            f"{header}{projector}")


def _requires_keys(app: dict[str, Any]) -> bool:
    auth = (app.get("args") or {}).get("auth")
    return isinstance(auth, dict) and auth.get("required") is True


def check_application(app: dict[str, Any], cluster: dict[str, Any] | None = None,
                      notes: list[str] | None = None, asks: list[Ask] | None = None,
                      weights: dict[str, int] | None = None, capacity: Capacity | None = None) -> list[str]:
    """The application's problems; `asks` and `weights` (when given) get what its deployments ask of a
    cluster at their fewest replicas, and the size of each model file it runs on the host. A pool's replica
    is checked against the memory of the nodes it can be placed on: the cluster file's node types, else the
    `capacity` (this machine) as one node."""
    try:
        args = parse_args(app.get("args"))
    except ConfigError as exc:
        return [str(exc)]  # without valid args there are no models to check the deployments against
    problems = []
    specs: dict[str, ModelSpec] = {}
    for model in args.models:
        try:
            spec = resolve_model(model, args.model_cache)
            preflight(spec)
            check_adapters(spec)
        except ConfigError as exc:
            problems.append(str(exc))
            continue
        specs[model.id] = spec
        if notes is not None:
            notes.append(source_note(model, spec))
    plans = {pool_deployment_name(pool.name): pool_plan(pool, list(specs.values())) for pool in args.pools}
    for pool in args.pools:
        problems += pool_problems(plans[pool_deployment_name(pool.name)])
        if notes is not None and pool.catalogue:
            found = [e.id for e in catalogue_entries(pool)]
            notes.append(f"pool {pool.name!r}: catalogue {pool.catalogue} holds {len(found)} model"
                         f"{'s' if len(found) != 1 else ''} ({', '.join(found)})")
    blocks = {b.get("name"): b for b in app.get("deployments") or []}
    models = {deployment_name(m.id): m for m in args.models if not m.pool}  # a pooled model has no deployment
    pools = {pool_deployment_name(p.name): p for p in args.pools}
    single = args.topology == "single"
    for name in blocks:
        if single and (name == "ChatProcessor" or name in models or name in pools):
            problems.append(f"deployment {name!r} has a block, but `topology: single` runs everything inside the "
                            "Ingress (no such deployment): remove the block (render-config does), and give the "
                            "Ingress the models' resources")
        elif name not in models and name not in CORE_DEPLOYMENTS and name not in pools:
            known = ", ".join([*CORE_DEPLOYMENTS, *models, *pools])
            problems.append(f"deployment {name!r} matches no model (deployments of this app: {known})")
    if single:  # the Ingress is the only deployment, and it reserves what the models need
        options = {"Ingress": apply_block(single_hosting_defaults(args), blocks.get("Ingress"))}
        for model in models.values():
            problems += _gpu_problems("Ingress", model, options["Ingress"], blocks.get("Ingress") or {})
    else:
        options = {name: apply_block(defaults, blocks.get(name)) for name, defaults in CORE_DEPLOYMENTS.items()}
        for name, model in models.items():
            options[name] = apply_block(model_deployment_defaults(model), blocks.get(name))
            problems += _model_problems(name, model, options[name], blocks.get(name) or {})
        for name, pool in pools.items():
            options[name] = apply_block(pool_deployment_defaults(pool, args.models), blocks.get(name))
    if cluster is not None:
        problems += fit_problems(options, cluster)
    nodes, where = _nodes(cluster, capacity)
    problems += _gpu_memory_label_problems(cluster)
    for name, plan in plans.items():
        host = "Ingress" if single else name
        problems += pool_node_problems(plan, replica_request(options[host]), nodes, where)
    if asks is not None:
        asks += _asks(options, args.models, specs, single, weights if weights is not None else {})
        _pool_asks(asks, args.pools, single)
    return problems


def _nodes(cluster: dict[str, Any] | None, capacity: Capacity | None) -> tuple[dict[str, dict[str, float]], str]:
    """The nodes a replica may be placed on, by name, with their resources: the cluster file's node types (as
    declared), else the capacity checked against (this machine) as one node."""
    if cluster is not None:
        types = cluster.get("available_node_types") or {}
        return ({t: _node_resources(nt) for t, nt in types.items() if isinstance(nt, dict)},
                "the cluster file's node types")
    if capacity is not None:
        return {"this machine": dict(capacity.resources)}, "where it runs"
    return {}, ""


def _node_resources(node_type: dict[str, Any]) -> dict[str, float]:
    """A node type's resources, with its GPUs' memory (GPU_MEMORY, bytes each) when its labels state it."""
    out = {k: float(v) for k, v in (node_type.get("resources") or {}).items()}
    stated = (node_type.get("labels") or {}).get(GPU_MEMORY_LABEL)
    if stated is not None and _mib_label(stated) is not None:
        out[GPU_MEMORY] = _mib_label(stated) * (1 << 20)
    return out


def _mib_label(value: Any) -> float | None:
    try:
        mib = float(value)
    except (TypeError, ValueError):
        return None
    return mib if mib > 0 and math.isfinite(mib) else None


def _gpu_memory_label_problems(cluster: dict[str, Any] | None) -> list[str]:
    types = (cluster or {}).get("available_node_types") or {}
    return [f"cluster file: node type {name!r}: label {GPU_MEMORY_LABEL} is {stated!r}, not the MiB of each of its "
            f"GPUs (a positive number, as a string: \"24576\")"
            for name, nt in types.items() if isinstance(nt, dict)
            for stated in [(nt.get("labels") or {}).get(GPU_MEMORY_LABEL)]
            if stated is not None and _mib_label(stated) is None]


def _asks(options: dict[str, dict[str, Any]], models: list[ModelConfig], specs: dict[str, ModelSpec],
          single: bool, weights: dict[str, int]) -> list[Ask]:
    """Each deployment's fewest replicas and one replica's request, with the host memory of the models it
    runs (the KV cache per replica; the weights go to `weights`, once per file) unless its
    ray_actor_options reserve memory themselves."""
    out = {name: Ask(name, fewest_replicas(opts), replica_request(opts)) for name, opts in options.items()}
    for name, opts in options.items():
        reserved = float((opts.get("ray_actor_options") or {}).get("memory") or 0)
        if reserved:
            out[name].request["memory"] = reserved
    for model in models:
        if model.pool:
            continue  # counted as its pool's budget (_pool_asks)
        host = "Ingress" if single else deployment_name(model.id)
        spec, ask = specs.get(model.id), out.get(host)
        if spec is None or ask is None:
            continue
        files, kv, why = model_memory(spec, model, ask.request)
        weights.update(files)
        if kv and "memory" not in (options[host].get("ray_actor_options") or {}):
            ask.request["memory"] = ask.request.get("memory", 0.0) + kv
        ask.memory_note = ask.memory_note or why
    return list(out.values())


def _pool_asks(asks: list[Ask], pools: list[Any], single: bool) -> None:
    """A pool replica asks its memory budget (what its models may take together), when it has one; a pool's
    replica on GPUs keeps its models in GPU memory, which pool_node_problems weighs instead."""
    by_name = {a.deployment: a for a in asks}
    for pool in pools:
        ask = by_name.get("Ingress" if single else pool_deployment_name(pool.name))
        if ask is None:
            continue
        if not single and ask.request.get("GPU", 0) > 0:
            ask.memory_note = ask.memory_note or f"pool {pool.name!r} on GPUs: its models take GPU memory"
        elif pool.memory_budget_mib:
            ask.request["memory"] = ask.request.get("memory", 0.0) + pool.memory_budget_mib * (1 << 20)
        else:
            ask.memory_note = ask.memory_note or f"pool {pool.name!r} has no memory_budget_mib: its models' memory not counted"


def _gpu_problems(name: str, model: ModelConfig, options: dict[str, Any], block: dict[str, Any]) -> list[str]:
    """The GPU the replica that runs `model`'s engine (its LlamaModel, or the Ingress) reserves vs what it uses."""
    problems = []
    gpus = (options.get("ray_actor_options") or {}).get("num_gpus", 0)
    if offloads(model) and not gpus:
        replaced = (" (a ray_actor_options block replaces the builder's defaults whole, so it must state num_gpus)"
                    if "ray_actor_options" in block else "")
        problems.append(f"model {model.id!r} offloads layers to a GPU (n_gpu_layers: {model.n_gpu_layers}) but "
                        f"{name} reserves no GPU (ray_actor_options.num_gpus: {gpus}){replaced}: llama.cpp would "
                        f"run on the CPU; set num_gpus: 1, or n_gpu_layers: 0")
    if model.n_gpu_layers == 0 and gpus:
        problems.append(f"{name} reserves a GPU (ray_actor_options.num_gpus: {gpus}) but model {model.id!r} "
                        f"has n_gpu_layers: 0, so it never uses it; leave n_gpu_layers out (auto: all layers on "
                        f"the GPU Ray gives the replica) or set num_gpus: 0")
    return problems


def _model_problems(name: str, model: ModelConfig, options: dict[str, Any], block: dict[str, Any]) -> list[str]:
    problems = _gpu_problems(name, model, options, block)
    ongoing = options.get("max_ongoing_requests")
    if isinstance(ongoing, int) and ongoing > model.n_seq_max:
        problems.append(f"{name}: max_ongoing_requests {ongoing} is above model {model.id!r}'s n_seq_max "
                        f"{model.n_seq_max}: the extra requests would wait inside the replica instead of Serve's "
                        f"queue (max_queued_requests); set it to {model.n_seq_max} or raise n_seq_max")
    router = block.get("request_router_config")
    if model.routing == "prefix" and isinstance(router, dict) and "request_router_class" not in router:
        problems.append(f"{name}: its request_router_config names no request_router_class, so Ray Serve routes "
                        f"with its default router, not the prefix-aware one model {model.id!r} asks for "
                        f"(routing: prefix): add request_router_class: {PREFIX_ROUTER_CLASS}, or set routing: load")
    if isinstance(router, dict) and router.get("request_router_class") == PREFIX_ROUTER_CLASS:
        kwargs = router.get("request_router_kwargs") or {}
        unknown = sorted(set(kwargs) - ROUTER_KWARGS)
        if unknown:
            problems.append(f"{name}: request_router_kwargs {', '.join(unknown)} are not settings of the prefix "
                            f"router (known: {', '.join(sorted(ROUTER_KWARGS))})")
        elif problem := router_kwargs_problem(kwargs):
            problems.append(f"{name}: request_router_kwargs: {problem}")
    replicas = block.get("num_replicas")
    if isinstance(replicas, int) and "autoscaling_config" not in block:
        problems.append(f"{name}: num_replicas: {replicas} has no effect: the builder gives model deployments an "
                        f"autoscaling_config, which Ray Serve uses instead; write autoscaling_config: "
                        f"{{min_replicas: {replicas}, max_replicas: {replicas}}}")
    return problems


def fit_problems(options: dict[str, dict[str, Any]], cluster: dict[str, Any]) -> list[str]:
    """Each deployment's replica must fit at least one node type of a cluster launcher file, by the
    `resources` the node type declares. This is per replica, which is what decides whether Ray can place
    it at all: replicas of different deployments may share a node, and a head that must also hold the
    CPU deployments at their max_replicas is a capacity question (tests/ops/test_cluster_config.py)."""
    node_types = cluster.get("available_node_types") or {}
    declared = {t: {k: float(v) for k, v in (nt.get("resources") or {}).items()}
                for t, nt in node_types.items() if isinstance(nt, dict) and "resources" in nt}
    undeclared = sorted(set(node_types) - set(declared))
    problems = []
    if not node_types:
        return ["the cluster file has no available_node_types to place replicas on"]
    for name, opts in options.items():
        request = replica_request(opts)
        if any(fits(request, res) for res in declared.values()):
            continue
        asks = ", ".join(f"{k}: {v:g}" for k, v in request.items())
        types = "; ".join(f"{t} {{{', '.join(f'{k}: {v:g}' for k, v in r.items())}}}" for t, r in declared.items())
        line = f"{name}: a replica reserves {{{asks}}}, which fits no node type of the cluster file ({types or 'none declares resources'})"
        if undeclared:
            line += (f"; {', '.join(undeclared)} declare{'s' if len(undeclared) == 1 else ''} no `resources` "
                     f"(Ray infers them from the instance type): declare them to check")
        problems.append(line)
    return problems
