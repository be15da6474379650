"""cluster.yaml is a valid Ray cluster-launcher config and fits llamaray.

Validated against the schema shipped inside the installed ``ray`` package
(the same file ``ray up`` checks), located without importing ray.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import pathlib
import re
from typing import Any

import jsonschema
import pytest
import yaml

from app.ops.ray_env import CLUSTER_RAY_ENV

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
CLUSTER_YAML = REPO_ROOT / "cluster.yaml"
SERVE_CONFIG_YAML = REPO_ROOT / "serve_config.yaml"


def _ray_schema_path() -> pathlib.Path:
    spec = importlib.util.find_spec("ray")
    assert spec is not None and spec.submodule_search_locations, (
        "the `ray` package is not installed; it ships the cluster schema "
        "(ray/autoscaler/ray-schema.json) this test validates against"
    )
    path = pathlib.Path(spec.submodule_search_locations[0]) / "autoscaler" / "ray-schema.json"
    assert path.is_file(), f"{path} missing from the installed ray package"
    return path


@pytest.fixture(scope="module")
def ray_validator() -> jsonschema.Validator:
    schema = json.loads(_ray_schema_path().read_text())
    # Same draft `ray up` uses: jsonschema.validate() picks it from $schema.
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    with CLUSTER_YAML.open() as f:
        return yaml.safe_load(f)


def _errors(validator: jsonschema.Validator, instance: dict[str, Any]) -> list[str]:
    return [
        f"{e.json_path}: {e.message}"
        for e in sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.path)))
    ]


def _worker_types(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    head = config["head_node_type"]
    return {k: v for k, v in config["available_node_types"].items() if k != head}


def _gpu_worker_types(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        k: v for k, v in _worker_types(config).items() if v.get("resources", {}).get("GPU", 0) >= 1
    }


def _all_setup_commands(config: dict[str, Any]) -> list[str]:
    commands = list(config.get("setup_commands", []))
    commands += config.get("worker_setup_commands", [])
    for node_type in _worker_types(config).values():
        commands += node_type.get("worker_setup_commands", [])
    return commands


# --- Ray's own schema ---------------------------------------------------------


def test_matches_ray_schema(ray_validator: jsonschema.Validator, config: dict[str, Any]) -> None:
    assert _errors(ray_validator, config) == []


def test_passes_rays_extra_checks(config: dict[str, Any]) -> None:
    # What ray.autoscaler._private.util.validate_config checks after the schema.
    assert config["head_node_type"] in config["available_node_types"]
    total_min = sum(t.get("min_workers", 0) for t in config["available_node_types"].values())
    assert total_min <= config["max_workers"]
    for name, node_type in _worker_types(config).items():
        assert node_type.get("min_workers", 0) <= node_type.get("max_workers", config["max_workers"]), name


def _drop_worker_node_config(c: dict[str, Any]) -> None:
    for node_type in _worker_types(c).values():
        del node_type["node_config"]


def _unknown_top_level_key(c: dict[str, Any]) -> None:
    c["gpu_workers"] = 2


def _unknown_node_type_key(c: dict[str, Any]) -> None:
    next(iter(_gpu_worker_types(c).values()))["num_gpus"] = 1


def _fractional_gpu_resource(c: dict[str, Any]) -> None:
    next(iter(_gpu_worker_types(c).values()))["resources"]["GPU"] = 0.5


def _missing_provider_type(c: dict[str, Any]) -> None:
    del c["provider"]["type"]


def _setup_command_not_a_list(c: dict[str, Any]) -> None:
    c["setup_commands"] = "pip install -e ~/llamaray"


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        (_drop_worker_node_config, "'node_config' is a required property"),
        (_unknown_top_level_key, "'gpu_workers' was unexpected"),
        (_unknown_node_type_key, "'num_gpus' was unexpected"),
        (_fractional_gpu_resource, "0.5 is not of type 'integer'"),
        (_missing_provider_type, "'type' is a required property"),
        (_setup_command_not_a_list, "is not of type 'array'"),
    ],
    ids=lambda v: v.__name__.strip("_") if callable(v) else None,
)
def test_ray_schema_rejects_broken_copy(
    ray_validator: jsonschema.Validator, config: dict[str, Any], breakage, expected: str
) -> None:
    broken = copy.deepcopy(config)
    breakage(broken)
    errors = _errors(ray_validator, broken)
    assert any(expected in e for e in errors), errors


# --- what llamaray needs from the cluster --------------------------------------


def test_head_node_declares_no_gpu(config: dict[str, Any]) -> None:
    head = config["available_node_types"][config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0, "a num_gpus=1 replica could land on the head"
    assert head["resources"].get("CPU", 0) >= 1, "head must host the CPU deployments"
    instance_type = head["node_config"].get("InstanceType", "")
    assert not re.match(r"^(g|p)\d", instance_type), f"{instance_type} is a GPU instance"


def test_gpu_worker_type_scales_from_zero(config: dict[str, Any]) -> None:
    gpu_types = _gpu_worker_types(config)
    assert gpu_types, "no worker type declares resources.GPU >= 1"
    for name, node_type in gpu_types.items():
        assert node_type["min_workers"] == 0, name
        assert node_type["max_workers"] >= 1, name
        assert node_type["resources"].get("CPU", 0) >= 1, f"{name}: replicas also reserve a CPU"
        assert node_type["max_workers"] <= config["max_workers"], name


def test_setup_builds_llama_cpp_python_with_cuda_by_the_project_tool(config: dict[str, Any]) -> None:
    # The same tool as `make install`: native kernels without AMX (llama.cpp #20824), keyed cache.
    builds = [c for c in _all_setup_commands(config) if "tools/llama_build.py --install" in c]
    assert builds, "no setup command runs tools/llama_build.py --install"
    assert all("--cuda" in c and "--cuda-arch" in c for c in builds), builds
    assert not [c for c in _all_setup_commands(config) if "CMAKE_ARGS=" in c], "bypasses the build tool"


def test_setup_installs_the_synced_project(config: dict[str, Any]) -> None:
    remote = [r for r, local in config["file_mounts"].items() if local in (".", "./")]
    assert remote, "file_mounts must sync the repo ('.') to the nodes"
    spellings = {remote[0], remote[0].replace("~", "$HOME", 1)}
    installs = [
        c
        for c in config["setup_commands"]
        if "pip install" in c and any(re.search(rf"-e \"?{re.escape(p)}\b", c) for p in spellings)
    ]
    assert installs, f"setup_commands must `pip install -e {remote[0]}`"


def test_start_commands(config: dict[str, Any]) -> None:
    head = " ; ".join(config["head_start_ray_commands"])
    assert "ray start --head" in head and "--port=6379" in head
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in head
    assert "--dashboard-host=0.0.0.0" in head
    workers = " ; ".join(config["worker_start_ray_commands"])
    assert "--address=$RAY_HEAD_IP:6379" in workers
    for commands in (config["head_start_ray_commands"], config["worker_start_ray_commands"]):
        assert commands[0].strip() == "ray stop"
        # Every node starts Ray with CLUSTER_RAY_ENV: HAProxy, Ray Serve's throughput settings, the proxy's GC
        # threshold (app/ops/ray_env.py).
        start = next(c for c in commands if "ray start" in c)
        assert all(f"{k}={v}" in start.split("ray start")[0] for k, v in CLUSTER_RAY_ENV.items()), start


def test_aws_provider(config: dict[str, Any]) -> None:
    provider = config["provider"]
    assert provider["type"] == "aws"
    assert {"region", "availability_zone", "cache_stopped_nodes"} <= provider.keys()
    assert config["auth"]["ssh_user"]


# --- fit with serve_config.yaml ---------------------------------------------------


def _serve_deployments() -> list[dict[str, Any]]:
    with SERVE_CONFIG_YAML.open() as f:
        serve_config = yaml.safe_load(f)
    return [d for app in serve_config.get("applications", []) for d in app.get("deployments", [])]


def _max_replicas(deployment: dict[str, Any]) -> int | None:
    autoscaling = deployment.get("autoscaling_config") or {}
    count = autoscaling.get("max_replicas", deployment.get("num_replicas", 1))
    return count if isinstance(count, int) else None  # "auto": unbounded here


def test_gpu_replicas_fit_gpu_workers_only(config: dict[str, Any]) -> None:
    gpu_deployments = [
        d for d in _serve_deployments() if (d.get("ray_actor_options") or {}).get("num_gpus", 0) > 0
    ]
    assert gpu_deployments, "serve_config.yaml has no GPU (num_gpus > 0) deployment"
    head = config["available_node_types"][config["head_node_type"]]["resources"]
    gpu_types = _gpu_worker_types(config).values()
    for d in gpu_deployments:
        opts = d["ray_actor_options"]
        gpus, cpus = opts["num_gpus"], opts.get("num_cpus", 1)
        assert head.get("GPU", 0) < gpus, f"{d['name']} could be placed on the head"
        assert any(
            t["resources"]["GPU"] >= gpus and t["resources"].get("CPU", 0) >= cpus for t in gpu_types
        ), f"{d['name']} (num_gpus={gpus}, num_cpus={cpus}) fits no GPU worker type"
    gpus_needed = sum((_max_replicas(d) or 0) * d["ray_actor_options"]["num_gpus"] for d in gpu_deployments)
    gpus_available = sum(t["max_workers"] * t["resources"]["GPU"] for t in gpu_types)
    assert gpus_needed <= gpus_available, (
        f"GPU deployments may scale to {gpus_needed} GPUs but the cluster caps at {gpus_available}"
    )


def test_cpu_replicas_fit_on_the_head(config: dict[str, Any]) -> None:
    # Otherwise CPU-only demand makes the autoscaler launch GPU nodes.
    cpu_deployments = [
        d for d in _serve_deployments() if not (d.get("ray_actor_options") or {}).get("num_gpus", 0)
    ]
    # Each CPU deployment states its most replicas (num_replicas: auto would leave the head's share open).
    assert all(_max_replicas(d) is not None for d in cpu_deployments), cpu_deployments
    cpus_needed = sum(
        _max_replicas(d) * (d.get("ray_actor_options") or {}).get("num_cpus", 1) for d in cpu_deployments
    )
    head_cpus = config["available_node_types"][config["head_node_type"]]["resources"].get("CPU", 0)
    assert cpus_needed <= head_cpus, (
        f"CPU deployments may need {cpus_needed} CPUs at max_replicas but the head declares {head_cpus}"
    )
