"""python -m bench.router: the prefix-aware request router against Serve's default one, on a
multi-turn chat workload over two model replicas.

For each router (`load`: Serve's default power of two choices; `prefix`: deployments/prefix_router.py)
llamaray is started on a Ray head with 2 logical GPUs (bench/harness/serve_driver.py) from serve_config.yaml
+ configs/local-cpu.yaml + configs/local-graph.yaml (model deployments of their own) +
configs/bench-router.yaml (two replicas of one llama.cpp thread each, 4 slots of 4096 tokens) + the
model's `routing` key, then driven by bench/load/conversations.py: 8 conversations x 6 turns, all 8
live at once (as many as the two replicas have slots), sharing a ~1,000-token system prompt
(`--context own`: each its own), each turn sending the history back after a user's think time
(`--think`, 1 s on average). Every request
records its TTFT and usage.prompt_tokens_details.cached_tokens.

Prints per router: the cache hit ratio (sum of cached / sum of prompt tokens), TTFT p50 / p95 and
the follow-up turns' TTFT p50, with FAIL next to a missed goal (prefix router: hit ratio >= 0.8 and
TTFT p50 at least 30% below the default router's). Writes <out>/router.json; logs in <out>/logs/.
Exits 1 when a server or a request failed (a missed goal is printed, not an exit status).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

import yaml

from app.ops.ray_env import LOCAL_RAY_ENV

from .harness.procs import CpuMeter, wait_until_quiet
from .harness.run import ROOT, comma_names, log, start_run
from .harness.servers import ServeDriverServer
from .load.conversations import run_conversations, shared_system_prompt, summarize_turns
from .reports.tables import fmt

ROUTERS = {"load": "Serve's default (power of two choices)", "prefix": "prefix-aware (deployments/prefix_router.py)"}
GOAL_HIT_RATIO = 0.8
GOAL_TTFT_CUT = 0.30   # the prefix router's TTFT p50 at least this much below the default's
SEED_BASE = 5000


class RouterBenchServer(ServeDriverServer):
    """llamaray with two model replicas on logical GPUs and the model's `routing` set to `routing`."""

    start_timeout_s = 300.0
    overlays = ("configs/local-cpu.yaml", "configs/local-graph.yaml", "configs/bench-router.yaml")

    def __init__(self, log_dir: Path, routing: str) -> None:
        self.routing = routing
        self.name = f"llamaray-{routing}"
        super().__init__(log_dir)

    def prepare(self) -> None:
        overlay = ROOT / "build" / f"bench-router-{self.routing}.yaml"
        overlay.parent.mkdir(parents=True, exist_ok=True)
        overlay.write_text(yaml.safe_dump({"applications": [{"name": "llamaray", "args": {"models": [
            {"id": "smollm2-135m", "routing": self.routing}]}}]}))
        self.overlays = (*type(self).overlays, str(overlay.relative_to(ROOT)))
        self.config_file = f"serve_bench_router_{self.routing}.yaml"
        super().prepare()

    def ray_env(self) -> dict[str, str]:
        return dict(LOCAL_RAY_ENV)  # Serve's settings for one machine; the driver keeps Serve's proxy on the port


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.router", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--routers", default="load,prefix", type=comma_names(ROUTERS),
                   help="comma-separated, from: " + ", ".join(ROUTERS))
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--concurrency", type=int, default=8,
                   help="conversations at a time (default: all 8, which fill the two replicas' 8 slots; with 4, "
                        "two a replica, the replica a conversation just left is nearly always the less loaded "
                        "one, so Serve's router keeps most turns in place by accident)")
    p.add_argument("--system-tokens", type=int, default=1000, help="about how long the system prompt is")
    p.add_argument("--context", choices=("shared", "own"), default="shared",
                   help="shared: one system prompt for all conversations (both replicas soon hold it, so a "
                        "turn on the other replica recomputes only its own history); own: each conversation "
                        "its own system prompt (a document it is about: a turn on the other replica "
                        "recomputes all of it)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--think", type=float, default=1.0,
                   help="seconds a user waits before the next turn (times a seeded factor in [0.5, 1.5)); "
                        "0: at once. Without it a closed loop of a few conversations keeps each on the "
                        "replica it started on whatever the router (the one it just left is the less "
                        "loaded), which is not how users arrive")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    p.add_argument("--quiet-wait", type=float, default=120.0,
                   help="before each run, wait up to this long for other processes to use < 0.25 cores")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results")
    ns = p.parse_args(argv)
    return ns


def system_prompts(ns: argparse.Namespace) -> str | Callable[[int], str]:
    if ns.context == "own":
        return lambda c: shared_system_prompt(ns.system_tokens, seed=1000 + c)
    return shared_system_prompt(ns.system_tokens)


async def drive(server: RouterBenchServer, ns: argparse.Namespace) -> dict[str, Any]:
    system = system_prompts(ns)
    common = dict(max_tokens=ns.max_tokens, temperature=ns.temperature, timeout_s=ns.timeout)
    # Warm-up: one short conversation with another system prompt (touches both code paths, caches nothing
    # the measured conversations can use).
    await run_conversations(server.base_url, server.model, conversations=2, turns=1, concurrency=2,
                            system_prompt="You are a terse assistant.", seed_base=1, **common)
    quiet = wait_until_quiet(server.session_id, ns.quiet_wait)
    meter = CpuMeter(server.session_id)
    t0 = time.perf_counter()
    results = await run_conversations(server.base_url, server.model, conversations=ns.conversations,
                                      turns=ns.turns, concurrency=ns.concurrency, system_prompt=system,
                                      seed_base=SEED_BASE, think_s=ns.think, **common)
    wall = time.perf_counter() - t0
    summary = summarize_turns(results)
    return {"router": server.routing, "summary": summary, "wall_s": round(wall, 1), "cpu": meter.read(),
            "other_load_before": quiet["other_cores"], "requests": [r.to_dict() for r in results]}


def goals(runs: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """FAIL notes per router (only the prefix router has goals, one of them relative to `load`)."""
    notes: dict[str, list[str]] = {r: [] for r in runs}
    prefix = runs.get("prefix")
    if prefix is None:
        return notes
    s = prefix["summary"]
    if s["n_failed"] or s["cache_hit_ratio"] is None or s["cache_hit_ratio"] < GOAL_HIT_RATIO:
        notes["prefix"].append(f"FAIL hit ratio (goal >= {GOAL_HIT_RATIO})")
    base = runs.get("load")
    if base is not None and base["summary"]["ttft_p50_ms"] and s["ttft_p50_ms"] is not None:
        cut = 1 - s["ttft_p50_ms"] / base["summary"]["ttft_p50_ms"]
        prefix["ttft_p50_cut"] = round(cut, 3)
        if cut < GOAL_TTFT_CUT:
            notes["prefix"].append(f"FAIL TTFT p50 {cut:.0%} below the default's (goal >= {GOAL_TTFT_CUT:.0%})")
    return notes


def format_table(runs: dict[str, dict[str, Any]], failures: dict[str, str]) -> str:
    notes = goals(runs)
    lines = ["| router | requests | failed | cache hit ratio | TTFT p50 ms | TTFT p95 ms | TTFT mean ms | "
             "follow-up TTFT p50 ms | goal |",
             "|---|---|---|---|---|---|---|---|---|"]

    for name, run in runs.items():
        s = run["summary"]
        lines.append(f"| {name} | {s['n_requests']} | {s['n_failed']} | {fmt(s['cache_hit_ratio'], '.3f')} | "
                     f"{fmt(s['ttft_p50_ms'], '.0f')} | {fmt(s['ttft_p95_ms'], '.0f')} | {fmt(s.get('ttft_mean_ms'), '.0f')} | "
                     f"{fmt(s['followup_ttft_p50_ms'], '.0f')} | {'; '.join(notes[name]) or 'ok' if name == 'prefix' else ''} |")
    if "ttft_p50_cut" in runs.get("prefix", {}):
        lines.append(f"\nprefix vs load: TTFT p50 {runs['prefix']['ttft_p50_cut']:.0%} lower")
    for name, why in failures.items():
        lines.append(f"{name}: {why}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    out: Path = ns.out
    log_dir = start_run(out)
    meta = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "cpus": os.cpu_count(),
            "workload": {"conversations": ns.conversations, "turns": ns.turns, "concurrency": ns.concurrency,
                         "system_prompt_chars": len(shared_system_prompt(ns.system_tokens)),
                         "context": ns.context,
                         "max_tokens": ns.max_tokens, "temperature": ns.temperature, "think_s": ns.think,
                         "seeds": f"{SEED_BASE} + 100 * conversation + turn",
                         "replicas": "2 x LlamaModel (1 logical GPU, 1 CPU, n_threads 1, n_seq_max 4, n_ctx 4096)"}}
    runs: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    try:
        for routing in ns.routers:
            server = RouterBenchServer(log_dir, routing)
            try:
                server.start()
                log(f"{routing}: running {ns.conversations} conversations x {ns.turns} turns")
                runs[routing] = asyncio.run(drive(server, ns))
                s = runs[routing]["summary"]
                log(f"{routing}: hit ratio {s['cache_hit_ratio']}, TTFT p50 {s['ttft_p50_ms']} ms, "
                    f"{s['n_failed']} failed, {runs[routing]['wall_s']} s")
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # noqa: BLE001 - report the other router anyway
                failures[routing] = f"not measured: {type(exc).__name__}: {exc}".splitlines()[0]
                log(f"{routing} failed: {exc}")
            finally:
                server.stop()
    except KeyboardInterrupt:
        failures["interrupted"] = "the run was interrupted; the table is partial"
    text = format_table(runs, failures)
    print(text, flush=True)
    path = out / "router.json"
    path.write_text(json.dumps({**meta, "runs": runs, "failures": failures}, indent=1))
    print(f"\nwrote {path}", flush=True)
    # Like `python -m bench`: a server or request that failed fails the run; a missed speed goal is
    # printed (FAIL in the table) for a person to read, since one run on a shared machine is noisy.
    return 1 if failures or not runs or any(r["summary"]["n_failed"] for r in runs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
