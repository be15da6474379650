"""python -m bench.pool: a pool of models loaded on demand against one deployment per model, on the same CPUs.

    .venv/bin/python -m bench.pool [--duration 60] [--rounds 2] [--concurrency 8] [--zipf 1.0] [--max-tokens 64]
        [--arms pool,dedicated] [--lora-rounds 0] [--out bench-results]

Six models (the bundled GGUF under six ids, m1 the most asked for) and requests whose model follows a Zipf
popularity (model k asked with weight 1/k^s), streamed by a closed loop of `--concurrency` clients. Two arms,
each the graph (Ingress -> ChatProcessor -> models) on a Ray head of its own with 2 CPUs
(bench/harness/serve_driver.py):

- `pool`: one pool, `LlamaPool-fleet`, of 2 replicas x 1 CPU, each holding at most 2 of the 6 models
  (`max_models: 2`): 4 of the 6 loaded at a time, the others loaded on their next request, evicting the least
  recently used idle one;
- `dedicated`: one `LlamaModel-<id>` deployment per model, 6 replicas of 1/3 CPU each, every model loaded
  all the time.

Every model runs one llama.cpp thread, 4 slots of 1024 tokens. Both clusters are up at once and take turns:
while one is measured every process of the other is stopped (SIGSTOP), and the order alternates round by round
(A B B A ...), so both see the machine within minutes of each other; each row pools its arm's segments. A
request that gets 503 (the pool's replicas all busy with models they cannot evict) is sent again after its
Retry-After, as a client would; its TTFT counts from the first attempt. Cold loads and evictions per minute come
from the pool's own metrics (`ray_llamaray_pool_loads_total`, `ray_llamaray_pool_evictions_total`, exported by the
driver's Ray on a port of its own).

`--workload agent` gives every model a preamble of its own (`--preamble-tokens`, a system prompt and tool notes, as
an agent framework sends with each turn) before each request's short question, and the models the context it
needs: a cold load in the pool then restores its preamble from the node's disk (app/kvstore, on by default) where
it would otherwise prefill it again; `short` (the default) asks the short prompts alone.

`--lora-rounds N` (N > 0) then runs `python -m bench.lora_mix --rounds N` (mixed-adapter against
adapter-homogeneous traffic on one engine) and prints its table after this one: that bench measures it; this one
does not do it twice. Writes <out>/pool.json; logs in <out>/logs/. Exits 1 when an arm did not run or a request
failed for good.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.ops.config_overlay import merge, without_unused_deployments
from app.ops.pools import POOL_ONGOING_PER_SLOT
from app.ops.ray_env import LOCAL_RAY_ENV
from app.pools.manager import FULL_RETRY_AFTER_S

from .harness.arms import arms_parser, take_turns
from .harness.bundled import SOURCE
from .harness.procs import CpuMeter, wait_until_quiet
from .harness.run import ROOT, VENV_BIN, free_port, log, run_cli, start_run
from .harness.servers import ServeDriverServer
from .load.loadgen import DEFAULT_PROMPTS, RequestResult, chat_payload, chat_url, percentile, stream_chat, summarize
from .reports.tables import fmt, write_run

N_MODELS = 6
POOL = "fleet"
MAX_MODELS = 2
CPUS = 2
ARMS = {"pool": f"LlamaPool-{POOL}: 2 replicas x 1 CPU, max_models {MAX_MODELS}",
        "dedicated": f"{N_MODELS} LlamaModel deployments x 1/3 CPU"}
# prompt_cache_mib: both arms' clusters are up at once on one machine, ten engines and the ones being unloaded; at
# the default 1 GiB each (and 256 MiB of queued KV writes) a long run of the agent workload filled a 24 GiB node.
MODEL_KEYS = {"n_ctx": 1024, "n_seq_max": 4, "n_threads": 1, "n_gpu_layers": 0, "prompt_cache_mib": 256}
SEED_BASE = 7000
SEGMENT_STRIDE = 100_000  # request indices of segment r start at r * SEGMENT_STRIDE (same in both arms)
RETRY_FOR_S = 60.0        # how long a request is sent again while the pool answers 503


def model_ids(n: int = N_MODELS) -> list[str]:
    """m1 ... mn, most popular first."""
    return [f"m{k}" for k in range(1, n + 1)]


def zipf_weights(n: int, s: float) -> list[float]:
    """Model k's share of the requests (k from 1): proportional to 1/k^s, summing to 1."""
    if n < 1 or s < 0:
        raise ValueError("need n >= 1 and s >= 0")
    raw = [1.0 / k ** s for k in range(1, n + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def model_of(index: int, weights: Sequence[float], seed: int = SEED_BASE) -> int:
    """The model (0-based) of request `index`: a draw of its own, so both arms ask the same sequence however
    many requests each gets through."""
    return random.Random(seed * 1_000_003 + index).choices(range(len(weights)), weights=weights)[0]


# ---- the two arms' serve configs ----------------------------------------------------------------------------

def base_config() -> dict[str, Any]:
    """serve_config.yaml with the local CPU and graph overlays: the graph on this machine."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    for overlay in ("configs/local-cpu.yaml", "configs/local-graph.yaml"):
        config = merge(config, yaml.safe_load((ROOT / overlay).read_text()))
    return config


# The bundled tokenizer reads this preamble at about 3.4 characters a token (15,000 characters were 4,399 tokens
# with the question and the template's markers): a larger figure overshoots the context the arms are given.
CHARS_PER_TOKEN = 3.3


def preamble(model: str, tokens: int) -> str:
    """`model`'s own system prompt of about `tokens` tokens (at most: see CHARS_PER_TOKEN)."""
    rule = (f"You are the assistant of team {model}. Tool `lookup_{model}`: finds an order by id; tool "
            f"`refund_{model}`: refunds it. Answer in one sentence and never invent an id. ")
    chars = int(tokens * CHARS_PER_TOKEN)
    return (rule * (chars // len(rule) + 1))[:chars]


def arm_config(arm: str, port: int, *, self_check: bool = True, n_ctx: int = MODEL_KEYS["n_ctx"]) -> dict[str, Any]:
    config = copy.deepcopy(base_config())
    config.setdefault("http_options", {})["port"] = port
    app = config["applications"][0]
    models = [{"id": m, "model_path": SOURCE, **MODEL_KEYS, "n_ctx": n_ctx, "startup_self_check": self_check}
              for m in model_ids()]
    front = [{"name": "Ingress", "ray_actor_options": {"num_cpus": 0}},
             {"name": "ChatProcessor", "autoscaling_config": {"min_replicas": 1, "max_replicas": 1},
              "ray_actor_options": {"num_cpus": 0}}]
    if arm == "pool":
        app["args"]["models"] = [{**m, "pool": POOL} for m in models]
        app["args"]["pools"] = [{"name": POOL, "max_models": MAX_MODELS}]
        app["deployments"] = [*front, {
            "name": f"LlamaPool-{POOL}", "max_ongoing_requests": MODEL_KEYS["n_seq_max"] * MAX_MODELS * POOL_ONGOING_PER_SLOT,
            "autoscaling_config": {"min_replicas": 2, "max_replicas": 2},
            "ray_actor_options": {"num_cpus": 1, "num_gpus": 0}}]
    elif arm == "dedicated":
        app["args"]["models"] = models
        share = round(CPUS / N_MODELS - 5e-5, 4)  # 6 x 0.3333 <= 2: Ray counts CPUs to 1/10,000
        app["deployments"] = [*front, *({
            "name": f"LlamaModel-{m['id']}", "max_ongoing_requests": MODEL_KEYS["n_seq_max"],
            "autoscaling_config": {"min_replicas": 1, "max_replicas": 1},
            "ray_actor_options": {"num_cpus": share, "num_gpus": 0}} for m in models)]
    else:
        raise ValueError(f"unknown arm {arm!r}")
    return without_unused_deployments(config)


class PoolBenchServer(ServeDriverServer):
    """One arm on a Ray head of its own with 2 CPUs and no GPU, its metrics on a port of its own."""

    start_timeout_s = 420.0
    num_gpus = 0
    num_cpus = CPUS

    def __init__(self, log_dir: Path, arm: str, self_check: bool, n_ctx: int = MODEL_KEYS["n_ctx"]) -> None:
        self.arm = arm
        self.n_ctx = n_ctx
        self.name = f"llamaray-{arm}"
        self.config_file = f"serve_bench_pool_{arm}.yaml"
        self.metrics_port = free_port()
        self.self_check = self_check
        super().__init__(log_dir)

    def prepare(self) -> None:
        path = ROOT / "build" / self.config_file
        path.parent.mkdir(parents=True, exist_ok=True)
        config = arm_config(self.arm, free_port(), self_check=self.self_check, n_ctx=self.n_ctx)
        path.write_text(f"# python -m bench.pool, arm {self.arm}\n" + yaml.safe_dump(config, sort_keys=False))
        run_cli([VENV_BIN / "llamaray", "check-config", path])  # what `make run` checks first
        self.config_path = path
        self.port = int(config["http_options"]["port"])
        self.model = model_ids()[0]
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="lrp-", dir="/tmp"))  # short: unix socket paths

    def command(self) -> list[str]:
        return [*super().command(), "--metrics-port", self.metrics_port]

    def ray_env(self) -> dict[str, str]:
        return dict(LOCAL_RAY_ENV)

    def metrics_text(self) -> str:
        try:
            return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text
        except httpx.HTTPError:
            return ""


_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")


def metric_total(text: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus metric's samples in `text` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m["name"] != name:
            continue
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m["labels"] or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m["value"])
    return total


def pool_counts(text: str) -> dict[str, float]:
    return {"loads": metric_total(text, "ray_llamaray_pool_loads_total", outcome="ok"),
            "load_failures": metric_total(text, "ray_llamaray_pool_loads_total", outcome="failed"),
            "evictions": metric_total(text, "ray_llamaray_pool_evictions_total"),
            "load_s": metric_total(text, "ray_llamaray_pool_load_seconds_sum"),
            "room_waits": metric_total(text, "ray_llamaray_pool_room_wait_seconds_count"),
            "room_wait_s": metric_total(text, "ray_llamaray_pool_room_wait_seconds_sum")}


# ---- the load ---------------------------------------------------------------------------------------------

async def one_request(client: httpx.AsyncClient, url: str, payload: dict[str, Any], index: int,
                      prompt_index: int) -> tuple[RequestResult, int]:
    """One streamed request, sent again after Retry-After while it gets 503 (for up to RETRY_FOR_S); TTFT and
    latency count from the first attempt. Returns the result and how many 503s it got."""
    first = time.perf_counter()
    busy = 0
    while True:
        result = await stream_chat(client, url, payload, index=index, prompt_index=prompt_index)
        if result.status != 503 or time.perf_counter() - first > RETRY_FOR_S:
            break
        busy += 1
        await asyncio.sleep(FULL_RETRY_AFTER_S)  # the Retry-After the pool answers with
    if result.ttft_s is not None:
        result.ttft_s += result.start - first
    result.start = first
    return result, busy


async def drive(base_url: str, models: list[str], weights: Sequence[float], *, concurrency: int, duration_s: float,
                first_index: int, max_tokens: int, temperature: float, timeout_s: float,
                preambles: dict[str, str] | None = None) -> dict[str, Any]:
    """A closed loop of `concurrency` clients for `duration_s`: request i asks model_of(i) with prompt and seed
    of its own. Requests still running at the end are waited for and counted."""
    url = chat_url(base_url)
    results: list[RequestResult] = []
    busy = 0
    counter = first_index
    stop_at = time.perf_counter() + duration_s
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0),
                                 limits=httpx.Limits(max_connections=concurrency + 4)) as client:
        async def worker() -> None:
            nonlocal counter, busy
            while time.perf_counter() < stop_at:
                i = counter
                counter += 1
                p = i % len(DEFAULT_PROMPTS)
                model = models[model_of(i, weights)]
                payload = chat_payload(model, DEFAULT_PROMPTS[p], max_tokens, temperature=temperature, seed=SEED_BASE + i)
                if preambles:
                    payload["messages"].insert(0, {"role": "system", "content": preambles[model]})
                result, retried = await one_request(client, url, payload, i, p)
                results.append(result)
                busy += retried

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    per_model: dict[str, int] = {}
    ttfts: dict[str, list[float]] = {}
    for r in results:
        name = models[model_of(r.index, weights)]
        per_model[name] = per_model.get(name, 0) + 1
        if r.ttft_s is not None:
            ttfts.setdefault(name, []).append(r.ttft_s)
    return {"results": results, "wall_s": wall, "busy_503": busy, "per_model": per_model, "ttfts": ttfts}


# ---- the report -------------------------------------------------------------------------------------------

def arm_record(arm: str, segments: list[dict[str, Any]]) -> dict[str, Any]:
    """An arm's row over its segments: requests, tokens over the summed wall time, TTFT percentiles over all
    requests, cold loads and evictions per minute of measuring."""
    results = [r for s in segments for r in s["results"]]
    wall = sum(s["wall_s"] for s in segments)
    summary = summarize(results, wall)
    minutes = wall / 60 if wall > 0 else float("nan")
    counts = {k: sum(s["pool"].get(k, 0.0) for s in segments)
              for k in ("loads", "load_failures", "evictions", "load_s", "room_waits", "room_wait_s")}
    per_model: dict[str, int] = {}
    ttfts: dict[str, list[float]] = {}
    for s in segments:
        for m, n in s["per_model"].items():
            per_model[m] = per_model.get(m, 0) + n
        for m, values in s.get("ttfts", {}).items():
            ttfts.setdefault(m, []).extend(values)
    return {"arm": arm, "segments": len(segments), "wall_s": round(wall, 1), "n_requests": summary["n_requests"],
            "n_failed": summary["n_failed"], "busy_503": sum(s["busy_503"] for s in segments),
            "tokens_per_s": summary["tokens_per_s"], "ttft_p50_ms": summary["ttft_ms"]["p50"],
            "ttft_p95_ms": summary["ttft_ms"]["p95"], "cold_loads_per_min": counts["loads"] / minutes,
            "evictions_per_min": counts["evictions"] / minutes, "load_failures": counts["load_failures"],
            "server_cores": (sum(s["cpu"].get("server_cores", 0.0) * s["wall_s"] for s in segments) / wall
                             if wall > 0 else None),
            "other_cores": max((s["cpu"].get("other_cores", 0.0) for s in segments), default=0.0),
            "per_model": dict(sorted(per_model.items(), key=lambda kv: int(kv[0][1:]))),
            # A cold request's parts: its wait for room (a held model to go idle), then the load itself.
            "load_s_mean": counts["load_s"] / counts["loads"] if counts["loads"] else None,
            "room_waits": counts["room_waits"],
            "room_wait_s_mean": counts["room_wait_s"] / counts["room_waits"] if counts["room_waits"] else None,
            "ttft_p50_ms_per_model": {m: percentile(v, 50) * 1000 for m, v in
                                      sorted(ttfts.items(), key=lambda kv: int(kv[0][1:]))},
            "errors": summary["errors"]}


def format_table(rows: list[dict[str, Any]], failures: dict[str, str]) -> str:
    lines = ["| arm | requests | failed | 503 then retried | tok/s | TTFT p50 ms | TTFT p95 ms | cold loads/min | "
             "evictions/min | server cores | other load (cores, max) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['arm']} | {r['n_requests']} | {r['n_failed']} | {r['busy_503']} | "
                     f"{fmt(r['tokens_per_s'], '.1f')} | {fmt(r['ttft_p50_ms'], '.0f')} | {fmt(r['ttft_p95_ms'], '.0f')} | "
                     f"{fmt(r['cold_loads_per_min'], '.1f')} | {fmt(r['evictions_per_min'], '.1f')} | "
                     f"{fmt(r['server_cores'], '.2f')} | {fmt(r['other_cores'], '.2f')} |")
    by = {r["arm"]: r for r in rows}
    if "pool" in by and "dedicated" in by and by["dedicated"]["tokens_per_s"]:
        p, d = by["pool"], by["dedicated"]
        lines.append("")
        lines.append(f"pool / dedicated: tok/s x{p['tokens_per_s'] / d['tokens_per_s']:.2f}"
                     + (f", TTFT p50 x{p['ttft_p50_ms'] / d['ttft_p50_ms']:.2f}" if p["ttft_p50_ms"] and d["ttft_p50_ms"] else "")
                     + (f", TTFT p95 x{p['ttft_p95_ms'] / d['ttft_p95_ms']:.2f}" if p["ttft_p95_ms"] and d["ttft_p95_ms"] else ""))
    if rows:
        lines.append("requests per model: " + "; ".join(
            f"{r['arm']} " + ", ".join(f"{m} {n}" for m, n in r["per_model"].items()) for r in rows))
        lines.append("TTFT p50 ms per model: " + "; ".join(
            f"{r['arm']} " + ", ".join(f"{m} {fmt(v, '.0f')}" for m, v in r.get("ttft_p50_ms_per_model", {}).items())
            for r in rows))
    for r in rows:
        if r.get("load_s_mean") is not None or r.get("room_waits"):
            lines.append(f"{r['arm']}: a load {fmt(r.get('load_s_mean'), '.2f')} s on average; "
                         f"{r.get('room_waits', 0):.0f} requests waited for room, "
                         f"{fmt(r.get('room_wait_s_mean'), '.2f')} s on average")
    for name, why in failures.items():
        lines.append(f"{name}: {why}")
    return "\n".join(lines)


# ---- main -------------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = arms_parser("python -m bench.pool", __doc__, ARMS, rounds=2)
    p.add_argument("--duration", type=float, default=60.0, help="seconds an arm is measured per round")
    p.add_argument("--concurrency", type=int, default=8, help="clients, each one request at a time")
    p.add_argument("--zipf", type=float, default=1.0, help="popularity exponent s: model k asked 1/k^s")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--no-self-check", action="store_true",
                   help="startup_self_check: false (a model's load skips the decode in a child process)")
    p.add_argument("--quiet-wait", type=float, default=20.0,
                   help="before each segment, wait up to this long for other processes to use < 0.25 cores")
    p.add_argument("--workload", choices=("short", "agent"), default="short",
                   help="agent: each model's own preamble (--preamble-tokens) before each short question")
    p.add_argument("--preamble-tokens", type=int, default=3000)
    p.add_argument("--lora-rounds", type=int, default=0,
                   help="then run `python -m bench.lora_mix --rounds N` (mixed vs homogeneous adapters); 0: not")
    return p.parse_args(argv)


def _segment(server: PoolBenchServer, ns: argparse.Namespace, r: int, weights: list[float]) -> dict[str, Any]:
    quiet = wait_until_quiet(server.session_id, ns.quiet_wait)
    before = pool_counts(server.metrics_text())
    meter = CpuMeter(server.session_id)
    preambles = {m: preamble(m, ns.preamble_tokens) for m in model_ids()} if ns.workload == "agent" else None
    seg = asyncio.run(drive(server.base_url, model_ids(), weights, concurrency=ns.concurrency,
                            duration_s=ns.duration, first_index=r * SEGMENT_STRIDE, max_tokens=ns.max_tokens,
                            temperature=ns.temperature, timeout_s=ns.timeout, preambles=preambles))
    seg["cpu"] = meter.read()
    seg["cpu"]["other_before"] = quiet["other_cores"]
    time.sleep(2.0)  # the replicas report metrics every 0.5 s, the agent exports them after
    after = pool_counts(server.metrics_text())
    seg["pool"] = {k: after[k] - before[k] for k in after}
    return seg


def _warm(server: PoolBenchServer, preambles: dict[str, str] | None = None) -> None:
    """One short request per model, so both arms start measuring with the code paths warm (the pool then holds
    the last models asked, as it would after any traffic); with the agent workload each model's request carries
    its preamble, so both arms measure the steady state of an agent's traffic (a preamble each model prefilled
    once: in memory in the dedicated arm, in memory or on the node's disk in the pool) rather than the first
    prefills."""
    with httpx.Client(timeout=600) as client:
        for m in model_ids():
            messages = [{"role": "user", "content": "Hi."}]
            if preambles:
                messages.insert(0, {"role": "system", "content": preambles[m]})
            client.post(chat_url(server.base_url), json={"model": m, "max_tokens": 4, "messages": messages})


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    out: Path = ns.out
    log_dir = start_run(out)
    weights = zipf_weights(N_MODELS, ns.zipf)
    def segment(arm: str, server: PoolBenchServer, n: int) -> dict[str, Any]:
        log(f"{arm}: segment {n // len(ns.arms) + 1} of {ns.rounds}, {ns.duration:.0f} s")
        seg = _segment(server, ns, n // max(len(ns.arms), 1), weights)
        row = arm_record(arm, [seg])
        log(f"{arm}: {row['n_requests']} requests, {row['tokens_per_s']:.1f} tok/s, "
            f"TTFT p50 {row['ttft_p50_ms']} ms, {seg['pool']}")
        return seg

    n_ctx = ns.preamble_tokens + 512 if ns.workload == "agent" else MODEL_KEYS["n_ctx"]
    warm_preambles = {m: preamble(m, ns.preamble_tokens) for m in model_ids()} if ns.workload == "agent" else None
    segments, failures = take_turns(
        ns.arms, ns.rounds, lambda arm: PoolBenchServer(log_dir, arm, self_check=not ns.no_self_check, n_ctx=n_ctx),
        segment, ready=lambda server: _warm(server, warm_preambles))
    rows = [arm_record(arm, segs) for arm, segs in segments.items() if segs]
    text = format_table(rows, failures)
    print(text, flush=True)
    raw = {arm: [{**{k: v for k, v in s.items() if k != "results"},
                  "requests": [r.to_dict() for r in s["results"]]} for s in segs] for arm, segs in segments.items()}
    write_run(out / "pool.json", ns, arms={a: ARMS[a] for a in ns.arms},
              models={m: round(w, 3) for m, w in zip(model_ids(), weights)}, model_keys=MODEL_KEYS,
              rows=rows, failures=failures, segments=raw)
    status = 1 if failures or not rows or any(r["n_failed"] for r in rows) else 0
    if ns.lora_rounds > 0:
        print("\nmixed-adapter against adapter-homogeneous traffic (python -m bench.lora_mix):", flush=True)
        status |= subprocess.call([sys.executable, "-m", "bench.lora_mix", "--rounds", str(ns.lora_rounds)], cwd=ROOT)
    return status


if __name__ == "__main__":
    sys.exit(main())
