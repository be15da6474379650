"""python -m bench.graph: does the graph keep up with a GPU, and how many CPUs does each tier need for it?

The three-deployment graph (Ingress -> ChatProcessor -> LlamaModel, configs/local-graph.yaml) with the
synthetic engine (configs/bench-graph.yaml: no model, tokens at the rates measured on an H200 for
SmolLM2-135M: 735 / 2583 / 3368 tok/s at 1 / 16 / 64 streams, extrapolated past 64), so every CPU tier
carries GPU-speed traffic on any machine: each streamed chunk crosses two Ray hops (model ->
ChatProcessor -> Ingress), plus Serve's proxy when clients call it (`--http proxy`; `--http direct`:
each Ingress replica serves HTTP itself and the streams are spread over them).

For each replica count R of the Ingress and the ChatProcessor (`--replicas`, default 1 then 2) the graph is
started on a Ray head of its own (bench/harness/serve_driver.py); then for each level of `--streams` a load
generator (bench/load/graph_load.py, a process of its own) keeps that many streamed chat completions of
`--max-tokens` in flight, and over a measured window after a warm-up the bench records:

- tokens/s and chunks/s delivered to the clients, and the engine's own tokens/s (the model replica's
  `stats`: tokens_decoded), so delivered / engine says whether the CPU tiers keep up;
- TTFT p50/p99 and what the graph adds to the engine's own (2.5 steps + prefill at the nominal rates);
  inter-chunk gap p99 and what it adds to the engine's own chunk interval (the coalescing window);
- the cores each tier uses idle, before the first level (health checks, metrics, control loops);
- CPU seconds per 1,000 delivered tokens of each tier, from /proc before and after the window:
  Ingress replicas, ChatProcessor replicas, Serve's proxy, the model replica (its Ray side: the engine
  only sleeps), Ray's other processes (controller, raylet, GCS, ...), the load generator, the bench.
  On any machine that is also cores per 1,000 tok/s: the sizing rule.

Prints two tables, the targets (R=1 at 64 streams: the H200 rate delivered, >= 95% of the engine's tokens,
inter-chunk p99 <= 100 ms added) and the sizing lines; writes <out>/graph.json; logs in <out>/logs/.
Exits 1 when a server failed or a stream failed (a missed target is printed, not an exit status).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from app.config.resolution import SYNTHETIC_PRESETS
from app.config.spec import deployment_name
from app.engine.stream import coalescing_window
from app.engine.synthetic import SyntheticRates
from app.ops.ray_env import CLUSTER_RAY_ENV, LOCAL_RAY_ENV, QUIET_RAY_ENV

from .harness import pyspy
from .harness.procs import TIERS, cpu_by_tier, listening_ports, machine_busy_s, sample, wait_until_quiet
from .harness.run import ROOT, VENV_BIN, log, start_run
from .harness.servers import ServeDriverServer
from .load.loadgen import DEFAULT_PROMPTS
from .reports import graph_report as report
from .reports.tables import fmt

APP = "llamaray"
MODEL_ID = "smollm2-135m"
MODEL_DEPLOYMENT = deployment_name(MODEL_ID)
PRESET = "h200-smollm2-135m"
STREAM_INTERVAL_S = 0.025    # the model's stream_interval_ms (app/config/schema.py default; bench-graph.yaml keeps it)
CHATML_OVERHEAD = 40         # bytes the synthetic model's chat template adds around a prompt (byte tokens)
DIRECT_PORTS = (8480, 8490)  # the Ingress replicas' own HTTP ports with --http direct: [min, max)

# Ray Serve's settings: `default` is what a cluster runs (CLUSTER_RAY_ENV, which cluster.yaml and the KubeRay
# manifest set: HAProxy as the front door and Ray Serve's throughput settings, app/ops/ray_env.py);
# `throughput` is app/ops/ray_env.py's set for one machine (gRPC between replicas, user code and router on the
# replica's main loop, GC frozen after start-up, the controller waking every second).
# `quiet` adds QUIET_RAY_ENV, Ray's background turned down as `serve-local` does (a cluster's nodes may set it too).
RAY_ENVS: dict[str, dict[str, str]] = {
    "default": dict(CLUSTER_RAY_ENV),
    "throughput": {k: v for k, v in LOCAL_RAY_ENV.items() if k != "RAY_SERVE_LOG_TO_STDERR"},
}
RAY_ENVS["quiet"] = {**RAY_ENVS["throughput"], **QUIET_RAY_ENV}


def rates() -> SyntheticRates:
    prefill, steps = SYNTHETIC_PRESETS[PRESET]
    return SyntheticRates(prefill, steps)


def prefill_s(r: SyntheticRates) -> float:
    mean_prompt = sum(len(p.encode()) for p in DEFAULT_PROMPTS) / len(DEFAULT_PROMPTS) + CHATML_OVERHEAD
    return mean_prompt / r.prefill_tokens_per_s


class GraphBenchServer(ServeDriverServer):
    """The graph with the synthetic model and `replicas` replicas each of the Ingress and the ChatProcessor."""

    overlays = ("configs/local-cpu.yaml", "configs/local-graph.yaml", "configs/bench-graph.yaml")
    http_port = 8474
    num_gpus = 0
    start_timeout_s = 240.0

    def __init__(self, log_dir: Path, replicas: int, http: str, ray_env: str, extra_env: dict[str, str]) -> None:
        self.replicas = replicas
        self.http = http
        self.mode_env = {**RAY_ENVS[ray_env], **extra_env}
        self.name = f"graph-r{replicas}"
        super().__init__(log_dir)

    def prepare(self) -> None:
        overlay = ROOT / "build" / f"bench-graph-r{self.replicas}.yaml"
        overlay.parent.mkdir(parents=True, exist_ok=True)
        scale = {"autoscaling_config": {"min_replicas": self.replicas, "max_replicas": self.replicas}}
        overlay.write_text(yaml.safe_dump({"applications": [{"name": APP, "deployments": [
            {"name": "Ingress", **scale}, {"name": "ChatProcessor", **scale}]}]}))
        self.overlays = (*type(self).overlays, str(overlay.relative_to(ROOT)))
        self.config_file = f"serve_bench_graph_r{self.replicas}.yaml"
        super().prepare()

    def ray_env(self) -> dict[str, str]:
        env = dict(self.mode_env)
        if self.http == "direct":
            env.update({"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
                        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(DIRECT_PORTS[0]),
                        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(DIRECT_PORTS[1]),
                        "RAY_SERVE_PORT_QUARANTINE_S": "0"})
        else:
            env.setdefault("RAY_SERVE_ENABLE_DIRECT_INGRESS", "0")
        return env


class Probe:
    """bench/harness/graph_probe.py for one server: its engine stats and replica pids, one JSON line a question."""

    def __init__(self, server: GraphBenchServer) -> None:
        if not server.gcs_address:
            raise RuntimeError(f"{server.name}: the serve driver did not say where its cluster is")
        # That cluster (never `auto`: another one on the machine could answer), Ray Serve's settings, and
        # the token a local cluster's drivers authenticate with (ray.init makes one in ~/.ray if none).
        env = {"RAY_AUTH_MODE": "token", **server.env(), "RAY_ADDRESS": server.gcs_address}
        self.proc = subprocess.Popen([str(VENV_BIN / "python"), "-m", "bench.harness.graph_probe", "--app", APP],
                                     cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=open(server.log_dir / f"{server.name}-probe.log", "w"), text=True)
        self._read()  # ready

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the bench's Ray probe exited; see its log")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"probe: {answer['error']}")
        return answer

    def ask(self, command: str) -> dict[str, Any]:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def stats(self) -> tuple[float, dict[str, Any]]:
        t = time.monotonic()
        answer = self.ask(f"stats {MODEL_DEPLOYMENT}")
        return (t + time.monotonic()) / 2, answer

    def pids(self, deployment: str, count: int) -> list[int]:
        return self.ask(f"replicas {deployment} {count}")["pids"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def replica_tiers(probe: Probe, server: GraphBenchServer) -> dict[int, str]:
    """{pid: tier} of the replicas, as they report themselves, each checked to be a process of the server."""
    out: dict[int, str] = {}
    ours = sample(server.session_id)
    for deployment, tier, count in (("Ingress", "ingress", server.replicas),
                                    ("ChatProcessor", "chat_processor", server.replicas), (MODEL_DEPLOYMENT, "model", 1)):
        pids = probe.pids(deployment, count)
        if len(pids) != count:
            raise RuntimeError(f"{deployment}: {len(pids)} replicas answered, expected {count}")
        strangers = [pid for pid in pids if pid not in ours]
        if strangers:
            raise RuntimeError(f"{deployment}: replicas {strangers} are not processes of {server.name}")
        out.update(dict.fromkeys(pids, tier))
    return out


def client_urls(server: GraphBenchServer, tiers: dict[int, str], timeout_s: float = 60.0) -> list[str]:
    """Where the load generator sends its streams: Serve's proxy, or each Ingress replica's own port (its
    HTTP server starts once the replica is up: waited for)."""
    if server.http == "proxy":
        return [server.base_url]
    urls = []
    deadline = time.monotonic() + timeout_s
    for pid, tier in sorted(tiers.items()):
        if tier != "ingress":
            continue
        while not (ports := [p for p in listening_ports(pid) if DIRECT_PORTS[0] <= p < DIRECT_PORTS[1]]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"Ingress replica {pid} listens on no port in {DIRECT_PORTS} after "
                                   f"{timeout_s:.0f} s: direct ingress off?")
            time.sleep(0.5)
        urls.append(f"http://127.0.0.1:{ports[0]}")
    return urls


def wait_engine_idle(probe: Probe, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = probe.stats()[1]
        if not stats.get("running") and not stats.get("waiting"):
            return
        time.sleep(0.5)
    raise TimeoutError(f"the engine still runs requests after {timeout_s:.0f} s")


class Window:
    """CPU time by process, the machine's busy time and the engine's stats at one end of a window."""

    def __init__(self, server: GraphBenchServer, probe: Probe, own: list[int]) -> None:
        self.t = time.monotonic()
        self.procs = sample(server.session_id, own)
        self.machine = machine_busy_s()
        self.engine_t, self.engine = probe.stats()


def _expect(proc: subprocess.Popen, marker: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the load generator exited before {marker!r} (status {proc.wait()})")
        if line.strip() == marker:
            return
    raise TimeoutError(f"no {marker!r} from the load generator within {timeout_s:.0f} s")


def measure_idle(server: GraphBenchServer, probe: Probe, tiers: dict[int, str], seconds: float) -> dict[str, float]:
    """Cores each tier uses with no request at all (health checks, metrics, control loops): what a node
    gives the graph whatever its traffic."""
    wait_engine_idle(probe)
    own = {**tiers, os.getpid(): "bench", probe.proc.pid: "bench"}
    start = Window(server, probe, list(own))
    time.sleep(seconds)
    end = Window(server, probe, list(own))
    cpu_s, _ = cpu_by_tier(start.procs, end.procs, APP, own)
    return {t: round(v / (end.t - start.t), 3) for t, v in cpu_s.items() if t not in ("loadgen", "bench")}


def profile_tiers(tiers: dict[int, str], ns: argparse.Namespace, name: str, streams: int) -> dict[Path, list]:
    """py-spy on every replica over the measured window (`--profile RATE`): a flame graph and the raw stacks each.
    The samplers take CPU from the tiers they watch, so a profiled level's CPU figures are not the sizing's."""
    out = ns.out / "profiles"
    out.mkdir(parents=True, exist_ok=True)
    samplers = {}
    for pid, tier in sorted(tiers.items()):
        base = out / f"{name}-s{streams}-{tier}-{pid}"
        samplers[base.with_suffix(".txt")] = pyspy.record(pid, ns.measure, base, ns.profile)
    return samplers


def print_profiles(samplers: dict[Path, list]) -> None:
    for raw, procs in samplers.items():
        for proc in procs:
            proc.wait(timeout=60)
        if raw.exists():
            lines = pyspy.summarise(pyspy.collapsed(raw))
            print(f"\n== {raw.with_suffix('.svg')}\n" + "\n".join(lines), flush=True)


def run_level(server: GraphBenchServer, probe: Probe, tiers: dict[int, str], urls: list[str], streams: int,
              ns: argparse.Namespace) -> dict[str, Any]:
    r = rates()
    step = r.step_s(streams)
    ramp = min(ns.warmup, ns.max_tokens * step)  # one request's length: streams start spread over it
    wait_engine_idle(probe)
    quiet = wait_until_quiet(server.session_id, ns.quiet_wait)
    with tempfile.NamedTemporaryFile(suffix=".json", dir=server.log_dir, delete=False) as f:
        out = Path(f.name)
    cmd = [str(VENV_BIN / "python"), "-m", "bench.load.graph_load", "--urls", ",".join(urls), "--model", MODEL_ID,
           "--streams", str(streams), "--max-tokens", str(ns.max_tokens), "--ramp-s", f"{ramp:.2f}",
           "--warmup-s", str(ns.warmup), "--measure-s", str(ns.measure), "--out", str(out)]
    log(f"{server.name} streams={streams}: {ns.warmup:.0f} s warm-up, {ns.measure:.0f} s measured")
    gen = subprocess.Popen(cmd, cwd=ROOT, env=server.env(), stdout=subprocess.PIPE, text=True,
                           stderr=open(server.log_dir / f"{server.name}-load-{streams}.log", "w"))
    try:
        own = {**tiers, gen.pid: "loadgen", os.getpid(): "bench", probe.proc.pid: "bench"}
        _expect(gen, "WINDOW START", ns.warmup + 120)
        start = Window(server, probe, list(own))
        samplers = profile_tiers(tiers, ns, server.name, streams) if ns.profile else {}
        _expect(gen, "WINDOW END", ns.measure + 120)
        end = Window(server, probe, list(own))
        gen.wait(timeout=120)
        print_profiles(samplers)
        load = json.loads(out.read_text())
    finally:
        if gen.poll() is None:
            gen.kill()
            gen.wait()
        out.unlink(missing_ok=True)
    cpu_s, ray_other = cpu_by_tier(start.procs, end.procs, APP, own)
    level = report.level_record(
        replicas=server.replicas, streams=streams, load=load, cpu_s=cpu_s, ray_other=ray_other,
        machine_cpu_s=end.machine - start.machine, cpu_window_s=end.t - start.t, engine_before=start.engine,
        engine_after=end.engine, engine_window_s=end.engine_t - start.engine_t, step_s=step,
        prefill_s=prefill_s(r), coalescing_s=coalescing_window(STREAM_INTERVAL_S, streams))
    level["other_load_before"] = quiet["other_cores"]
    d = level["delivered"]
    log(f"{server.name} streams={streams}: {d['tokens_per_s']:.0f} tok/s delivered, engine "
        f"{level['engine']['tokens_per_s']:.0f}, TTFT p50 {fmt(level['ttft_ms']['p50'])} ms, gap p99 "
        f"{fmt(level['gap_ms']['p99'])} ms, serving {fmt(report.serving_cpu_per_1k(level), '.3f')} "
        f"CPU s / 1k tokens, other load {level['other_cores']:.2f} cores")
    return level


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.graph", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", default="1,2", help="comma-separated replica counts of the Ingress and the "
                                                     "ChatProcessor (each count: the graph started afresh)")
    p.add_argument("--streams", default="64,128,256", help="comma-separated levels of concurrent streams")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--warmup", type=float, default=15.0, help="seconds of each level before its window")
    p.add_argument("--measure", type=float, default=40.0, help="seconds of each level's measured window")
    p.add_argument("--idle", type=float, default=10.0,
                   help="seconds the idle graph is measured before the first level (0: not)")
    p.add_argument("--http", choices=("proxy", "direct"), default="proxy",
                   help="proxy: clients call the front door on http_options.port (serve_config.yaml's shape: "
                        "HAProxy with the `default` Ray settings, as clusters run it; Serve's proxy with the "
                        "others, or with --env RAY_SERVE_ENABLE_HA_PROXY=0); direct: each Ingress "
                        "replica's own HTTP server (Ray Serve's direct ingress), the streams spread over them")
    p.add_argument("--ray-env", choices=tuple(RAY_ENVS), default="default",
                   help="Ray Serve's settings: " + "; ".join(f"{k}: {v or 'Ray defaults'}" for k, v in RAY_ENVS.items()))
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment variable for the server's Ray processes (repeatable)")
    p.add_argument("--quiet-wait", type=float, default=60.0,
                   help="before each level, wait up to this long for other processes to use < 0.25 cores")
    p.add_argument("--profile", type=int, default=0, metavar="RATE",
                   help="py-spy at RATE samples a second on every replica over each measured window: flame graphs "
                        "in <out>/profiles/ (0: none; the samplers' CPU counts in the tiers' figures)")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results")
    ns = p.parse_args(argv)
    ns.replicas = [int(x) for x in ns.replicas.split(",") if x.strip()]
    ns.streams = [int(x) for x in ns.streams.split(",") if x.strip()]
    if any(c > 256 for c in ns.streams):
        p.error("--streams: the synthetic model has 256 slots (n_seq_max's limit)")
    bad = [e for e in ns.env if "=" not in e]
    if bad:
        p.error(f"--env needs KEY=VALUE: {bad}")
    ns.extra_env = dict(e.split("=", 1) for e in ns.env)
    return ns


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    log_dir = start_run(ns.out)
    meta = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "cpus": os.cpu_count(),
            "workload": {"kind": "closed loop, streamed chat completions", "max_tokens": ns.max_tokens,
                         "warmup_s": ns.warmup, "measure_s": ns.measure, "streams": ns.streams,
                         "replicas": ns.replicas, "http": ns.http, "ray_env": ns.ray_env,
                         "env": {**RAY_ENVS[ns.ray_env], **ns.extra_env}, "engine": f"synthetic, preset {PRESET}",
                         "engine_ttft": f"{report.ENGINE_TTFT_STEPS} nominal steps + prefill",
                         "engine_gap": "the last nominal step end within the coalescing window"},
            "command": " ".join(["python -m bench.graph", *(argv if argv is not None else sys.argv[1:])])}
    levels: list[dict[str, Any]] = []
    idle: dict[int, dict[str, float]] = {}
    failures: dict[str, str] = {}
    try:
        for replicas in ns.replicas:
            server = GraphBenchServer(log_dir, replicas, ns.http, ns.ray_env, ns.extra_env)
            probe = None
            try:
                server.start()
                probe = Probe(server)
                tiers = replica_tiers(probe, server)
                urls = client_urls(server, tiers)
                log(f"{server.name}: replicas {tiers}; clients call {urls}")
                if ns.idle > 0:
                    idle[replicas] = measure_idle(server, probe, tiers, ns.idle)
                    log(f"{server.name} idle: {idle[replicas]} cores")
                for streams in ns.streams:
                    levels.append(run_level(server, probe, tiers, urls, streams, ns))
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # noqa: BLE001 - the other replica counts still run
                failures[server.name] = f"not measured: {type(exc).__name__}: {exc}".splitlines()[0]
                log(f"{server.name} failed: {exc}")
            finally:
                if probe is not None:
                    probe.close()
                log(f"stopping {server.name}")
                server.stop()
    except KeyboardInterrupt:
        failures["interrupted"] = "the run was interrupted; the tables are partial"
    text = report.format_tables(levels, idle)
    checks = report.target_checks(levels)
    if checks:
        text += "\n\ntargets:\n" + "\n".join(f"  {'ok  ' if ok else 'FAIL'} {what}" for ok, what in checks)
    sizing = report.sizing(levels)
    if sizing:
        text += "\n\n" + "\n".join(sizing)
    for name, why in failures.items():
        text += f"\n{name}: {why}"
    print(text, flush=True)
    path = ns.out / "graph.json"
    report_json = {**meta, "tiers": list(TIERS), "idle_cores": idle, "levels": levels,
                   "targets": [{"ok": ok, "what": w} for ok, w in checks],
                   "sizing": sizing, "failures": failures}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report_json, indent=1, default=str) + "\n")
    print(f"\nwrote {path}", flush=True)
    return 1 if failures or not levels or any(lv["failed"] for lv in levels) else 0


if __name__ == "__main__":
    sys.exit(main())
