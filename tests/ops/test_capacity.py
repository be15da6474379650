"""`llamaray check-config` sums what a config asks of a cluster at its fewest replicas (CPUs, GPUs, host
memory measured from the GGUF) against what a node or a cluster file has, in both shapes."""

from __future__ import annotations

import dataclasses

import yaml

from app.model_sources.gguf import read_metadata
from app.config.resolution import resolve_model
from app.config.schema import ModelConfig
from app.config.spec import deployment_name
from app.ops.capacity import (
    GIB,
    Capacity,
    cluster_capacity,
    fewest_replicas,
    host_cache_bytes,
    kv_cache_bytes,
    local_node,
)
from app.kvstore.tiers import MAX_QUEUED_BYTES
from app.ops.cli import capacity_for, main as cli_main
from app.ops.config_check import check_config
from app.ops.placement import CHAT_PROCESSOR_DEFAULTS, INGRESS_DEFAULTS
from tests.support.serve_harness import BUNDLED

NODE = Capacity({"CPU": 2.0, "GPU": 0.0, "memory": 16.0 * GIB}, "a test node")


def _config(n: int, topology: str = "graph", **model) -> dict:
    models = [{"id": f"m{i}", "model_path": BUNDLED, "n_threads": 1, "n_ctx": 512, "n_seq_max": 2, **model}
              for i in range(n)]
    return {"applications": [{"name": "llamaray", "args": {"topology": topology, "auth": {"required": False},
                                                           "models": models}}]}


def test_six_one_thread_models_do_not_fit_two_cpus():
    (line,) = check_config(_config(6), capacity=NODE)
    assert "ask 6 CPU in all" in line and "a test node has 2" in line, line
    assert "LlamaModel-m0 1 x 1" in line and "LlamaModel-m5 1 x 1" in line and "Ingress 1 x 0" not in line, line


def test_two_fit_and_the_front_door_asks_nothing():
    assert INGRESS_DEFAULTS["ray_actor_options"]["num_cpus"] == 0
    assert CHAT_PROCESSOR_DEFAULTS["ray_actor_options"]["num_cpus"] == 0
    assert check_config(_config(2), capacity=NODE) == []


def test_a_front_door_that_reserves_cpus_is_named_when_cpus_are_short():
    config = _config(2)
    config["applications"][0]["deployments"] = [{"name": "Ingress", "ray_actor_options": {"num_cpus": 0.1}},
                                                {"name": "ChatProcessor", "ray_actor_options": {"num_cpus": 0.1}}]
    (line,) = check_config(config, capacity=NODE)
    assert "ask 2.2 CPU in all" in line and "Ingress 1 x 0.1" in line and "ChatProcessor 1 x 0.1" in line, line
    assert "leave Ingress, ChatProcessor (the front door) unplaced" in line and "num_cpus: 0" in line, line


def test_min_replicas_count_and_max_replicas_do_not():
    config = _config(1)
    config["applications"][0]["deployments"] = [{"name": deployment_name("m0"), "autoscaling_config": {
        "min_replicas": 3, "max_replicas": 8}}]
    (line,) = check_config(config, capacity=NODE)
    assert "ask 3 CPU in all" in line and "LlamaModel-m0 3 x 1" in line, line
    assert fewest_replicas({"autoscaling_config": {"min_replicas": 0, "initial_replicas": 2}}) == 2
    assert fewest_replicas({"num_replicas": 4}) == 4 and fewest_replicas({"num_replicas": "auto"}) == 1
    assert fewest_replicas({}) == 1


def test_gpus_are_summed():
    (line,) = check_config(_config(2, n_gpu_layers=-1), capacity=NODE)
    assert "ask 2 GPU in all" in line and "a test node has 0" in line, line


def test_single_shape_sums_the_engines_its_ingress_hosts():
    (line,) = check_config(_config(3, topology="single"), capacity=NODE)
    assert "ask 3 CPU in all" in line and "Ingress 1 x 3" in line, line


def test_memory_is_the_file_once_and_each_replicas_kv_cache():
    spec = resolve_model(ModelConfig(id="m", model_path=BUNDLED), None)
    meta = read_metadata(spec.path)
    # SmolLM2-135M: 30 layers, 3 KV heads of 64 dims: 30 * 3 * 128 * 2 bytes a token
    assert kv_cache_bytes(meta, 512, 2) == 30 * 3 * 128 * 2 * 1024
    size = __import__("os").path.getsize(spec.path)
    small = Capacity({"CPU": 64.0, "memory": float(size)}, "a small node")
    (line,) = check_config(_config(2), capacity=small)
    assert "memory in all" in line and f"model files {size / GIB:.2f} GiB" in line, line
    # Each replica: its KV cache and its host caches (the prompt cache, the KV tiers' write queue).
    per_replica = kv_cache_bytes(meta, 512, 2) + host_cache_bytes(spec)
    roomy = Capacity({"CPU": 64.0, "memory": float(size + 2 * per_replica)}, "a node")
    assert check_config(_config(2), capacity=roomy) == []
    short = Capacity({"CPU": 64.0, "memory": float(size + 2 * per_replica - 1)}, "a node")
    assert check_config(_config(2), capacity=short) != []


def test_host_caches_are_the_prompt_cache_and_with_kv_tiers_their_write_queue():
    base = ModelConfig(id="m", model_path=BUNDLED, prompt_cache_mib=100)
    spec = resolve_model(base, None)
    assert host_cache_bytes(spec) == 100 * (1 << 20) + MAX_QUEUED_BYTES  # the disk tier is on by default
    off = resolve_model(ModelConfig(id="m", model_path=BUNDLED, prompt_cache_mib=0, kv_cache={"disk": False}), None)
    assert host_cache_bytes(off) == 0
    # Only a llama.cpp chat engine keeps prompts' KV: an embedding model's engine has neither.
    assert host_cache_bytes(dataclasses.replace(spec, kind="embedding")) == 0


def test_a_draft_models_file_and_kv_cache_are_counted(tmp_path):
    from tools.early_exit_gguf import write_early_exit

    draft = str(write_early_exit(tmp_path / "draft.gguf", layers=10))
    spec = resolve_model(ModelConfig(id="m", model_path=BUNDLED), None)
    model_kv, draft_kv = (kv_cache_bytes(read_metadata(p), 512, 2) for p in (spec.path, draft))
    sizes = __import__("os").path.getsize(spec.path) + __import__("os").path.getsize(draft)
    config = _config(1, speculative={"type": "draft", "draft_model": draft})
    host = host_cache_bytes(spec)
    enough = Capacity({"CPU": 64.0, "memory": float(sizes + model_kv + draft_kv + host)}, "a node")
    assert check_config(config, capacity=enough) == []
    short = Capacity({"CPU": 64.0, "memory": float(sizes + model_kv + draft_kv + host - 1)}, "a node")
    (line,) = check_config(config, capacity=short)
    assert f"model files {sizes / GIB:.2f} GiB" in line, line


def test_a_cluster_file_at_its_largest():
    cluster = {"head_node_type": "head", "available_node_types": {
        "head": {"resources": {"CPU": 2}, "max_workers": 0},
        "cpu": {"resources": {"CPU": 2}, "min_workers": 0, "max_workers": 1}}}
    assert cluster_capacity(cluster).resources == {"CPU": 4.0}
    assert check_config(_config(4), cluster, capacity=cluster_capacity(cluster)) == []
    problems = check_config(_config(5), cluster, capacity=cluster_capacity(cluster))
    assert len(problems) == 1 and "ask 5 CPU" in problems[0] and "the cluster file at its largest" in problems[0] and "declare) has 4:" in problems[0]


def test_which_capacity_the_cli_checks():
    local = {"http_options": {"host": "127.0.0.1"}}
    assert capacity_for("auto", local, None).source.startswith("this machine")
    assert capacity_for("auto", {}, None).source.startswith("this machine")  # Serve's default host is loopback
    assert capacity_for("auto", {"http_options": {"host": "0.0.0.0"}}, None) is None  # a cluster's config
    assert capacity_for("local", {"http_options": {"host": "0.0.0.0"}}, None).source.startswith("this machine")
    assert capacity_for("none", local, None) is None
    assert "GPU" in local_node().resources and local_node().resources["CPU"] >= 1


def test_cli_says_the_sum_and_what_is_there(tmp_path, capsys):
    path = tmp_path / "six.yaml"
    path.write_text(yaml.safe_dump(_config(64)))  # more than any test machine has
    assert cli_main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "ask 64 CPU in all" in err and "this machine, one Ray node" in err, err
    assert cli_main(["check-config", str(path), "--capacity", "none"]) == 0
