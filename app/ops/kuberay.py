"""A KubeRay `RayService` manifest around a rendered serve config (`llamaray render-config --format
rayservice`), so deploy/kuberay/rayservice.yaml and serve_config.yaml never drift: the manifest's
`serveConfigV2` is exactly the rendered serve config, as a YAML string.

The cluster mirrors cluster.yaml: a head without a GPU (GCS, dashboard, Serve controller, the CPU
deployments) and one GPU worker group that KubeRay's in-tree autoscaler grows from 0 when a
`num_gpus: 1` model replica is pending.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from .ray_env import CLUSTER_RAY_ENV

RAY_VERSION = "2.60.0"
# No image is published: build one with deploy/kuberay/Dockerfile and pass its name with --image.
DEFAULT_IMAGE = "registry.example.com/llamaray:0.1.0"


class _Block(str):
    """A string dumped as a YAML literal block (`|`)."""


def _block(dumper: yaml.SafeDumper, data: _Block) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(data), style="|")


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Block, _block)


# The API keys every replica reads (app/http/auth.py, `auth.api_keys_env`), from a Secret the operator creates:
#   kubectl create secret generic llamaray-api-keys --from-literal=keys="$(openssl rand -hex 32)"
# Not optional: without the Secret no pod starts, so the production shape never serves without keys.
API_KEYS_SECRET = "llamaray-api-keys"
API_KEYS_ENV = {"name": "LLAMARAY_API_KEYS",
                "valueFrom": {"secretKeyRef": {"name": API_KEYS_SECRET, "key": "keys"}}}

# Credentials for models fetched by name (docs/configuration.md, Model sources), from optional Secrets: a
# pod starts without them (public repos, an instance role), and reads them when the operator creates them:
#   kubectl create secret generic llamaray-hf-token --from-literal=token=hf_...
#   kubectl create secret generic llamaray-aws --from-literal=access_key_id=... --from-literal=secret_access_key=...
SOURCE_CREDENTIALS_ENV = [
    {"name": env, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}}
    for env, secret, key in (("HF_TOKEN", "llamaray-hf-token", "token"),
                             ("AWS_ACCESS_KEY_ID", "llamaray-aws", "access_key_id"),
                             ("AWS_SECRET_ACCESS_KEY", "llamaray-aws", "secret_access_key"))]


def _container(name: str, image: str, resources: dict[str, Any], ports: list[dict[str, Any]] | None = None) -> dict:
    env = [copy.deepcopy(API_KEYS_ENV), *copy.deepcopy(SOURCE_CREDENTIALS_ENV),
           *({"name": k, "value": v} for k, v in CLUSTER_RAY_ENV.items())]  # each node's front door: app/ops/ray_env.py
    container: dict[str, Any] = {"name": name, "image": image, "env": env,
                                 "resources": {"requests": dict(resources), "limits": dict(resources)}}
    if ports:
        container["ports"] = ports
    return container


def rayservice_manifest(serve_config: dict[str, Any], *, image: str = DEFAULT_IMAGE, name: str = "llamaray",
                        gpu_max_replicas: int = 4) -> dict[str, Any]:
    head = _container("ray-head", image, {"cpu": "8", "memory": "32Gi"}, ports=[
        {"containerPort": 6379, "name": "gcs-server"}, {"containerPort": 8265, "name": "dashboard"},
        {"containerPort": 10001, "name": "client"}, {"containerPort": 8000, "name": "serve"}])
    worker = _container("ray-worker", image, {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": 1})
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": name},
        "spec": {
            "serveConfigV2": _Block(yaml.safe_dump(serve_config, sort_keys=False)),
            "rayClusterConfig": {
                "rayVersion": RAY_VERSION,
                "enableInTreeAutoscaling": True,
                # Hand a GPU node back after 10 idle minutes, as cluster.yaml does.
                "autoscalerOptions": {"idleTimeoutSeconds": 600},
                "headGroupSpec": {
                    # num-gpus 0: a num_gpus: 1 model replica can never land on the head.
                    "rayStartParams": {"dashboard-host": "0.0.0.0", "num-gpus": "0"},
                    "template": {"spec": {"containers": [head]}},
                },
                "workerGroupSpecs": [{
                    "groupName": "gpu",
                    "replicas": 0,
                    "minReplicas": 0,
                    "maxReplicas": gpu_max_replicas,
                    "rayStartParams": {},
                    "template": {"spec": {
                        "containers": [worker],
                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    }},
                }],
            },
        },
    }


def dump_manifest(manifest: dict[str, Any], header: str) -> str:
    return header + yaml.dump(manifest, Dumper=_Dumper, sort_keys=False, width=120)
