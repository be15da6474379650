"""deploy/kuberay/rayservice.yaml: a KubeRay RayService whose serveConfigV2 is serve_config.yaml, generated
by `llamaray render-config --format rayservice` (regenerated here and compared, so the two never drift)."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from app.ops.cli import main as cli_main
from app.ops.ray_env import CLUSTER_RAY_ENV
from app.ops.config_check import check_config

REPO = pathlib.Path(__file__).resolve().parents[2]
COMMITTED = REPO / "deploy" / "kuberay" / "rayservice.yaml"
COMMAND = ["render-config", "serve_config.yaml", "--format", "rayservice",
           "--image", "registry.example.com/llamaray:0.1.0", "-o", "deploy/kuberay/rayservice.yaml"]


@pytest.fixture(scope="module")
def manifest() -> dict:
    return yaml.safe_load(COMMITTED.read_text())


def test_committed_manifest_is_what_the_command_generates_now(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the header names the files as the command was given them
    out = tmp_path / "rayservice.yaml"
    assert cli_main([*COMMAND[:-1], str(out)]) == 0
    generated = out.read_text().replace(str(out), "deploy/kuberay/rayservice.yaml")
    assert generated == COMMITTED.read_text(), (
        "deploy/kuberay/rayservice.yaml is stale: run `python -m app.ops.cli " + " ".join(COMMAND) + "`")


def test_serve_config_v2_is_exactly_the_rendered_serve_config(manifest):
    assert isinstance(manifest["spec"]["serveConfigV2"], str)
    assert yaml.safe_load(manifest["spec"]["serveConfigV2"]) == yaml.safe_load((REPO / "serve_config.yaml").read_text())


def _containers(group: dict) -> list[dict]:
    return group["template"]["spec"]["containers"]


def test_rayservice_shape(manifest):
    assert (manifest["apiVersion"], manifest["kind"]) == ("ray.io/v1", "RayService")
    cluster = manifest["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == "2.60.0" and cluster["enableInTreeAutoscaling"] is True
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    for c in _containers(head):
        for kind in ("requests", "limits"):
            assert "nvidia.com/gpu" not in c["resources"].get(kind, {}), c["name"]
    assert 8000 in {p["containerPort"] for c in _containers(head) for p in c.get("ports", [])}
    (gpu,) = cluster["workerGroupSpecs"]
    assert gpu["minReplicas"] == 0 < gpu["maxReplicas"]
    for c in _containers(gpu):
        assert int(c["resources"]["limits"]["nvidia.com/gpu"]) >= 1, c["name"]
    images = {c["image"] for g in (head, gpu) for c in _containers(g)}
    assert len(images) == 1  # one image on every pod, as cluster.yaml sets up every node the same way
    for c in (*_containers(head), *_containers(gpu)):  # CLUSTER_RAY_ENV: app/ops/ray_env.py
        assert {e["name"]: e.get("value") for e in c["env"]}.items() >= CLUSTER_RAY_ENV.items(), c["name"]


def test_each_replica_fits_a_pod_of_the_manifest(manifest):
    # The pods' CPU/GPU as node types, for check-config's per-replica fit.
    cluster = manifest["spec"]["rayClusterConfig"]
    head_cpu = float(_containers(cluster["headGroupSpec"])[0]["resources"]["limits"]["cpu"])
    limits = _containers(cluster["workerGroupSpecs"][0])[0]["resources"]["limits"]
    node_types = {"head": {"resources": {"CPU": head_cpu, "GPU": 0}},
                  "gpu": {"resources": {"CPU": float(limits["cpu"]), "GPU": int(limits["nvidia.com/gpu"])}}}
    serve_config = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    assert check_config(serve_config, {"available_node_types": node_types}) == []
