"""python -m bench.tenants: the fair share of a model's slots, a polite key beside a greedy one.

    .venv/bin/python -m bench.tenants [--alone 15] [--duration 40] [--rounds 1] [--greedy 16] [--slots 8]
        [--max-tokens 24] [--arms fair,fcfs] [--out bench-results]

Two keys of equal priority (`normal`) in a keys file of policies (app/tenants/policies.py): `greedy` keeps
`--greedy` streams going (a closed loop: each stream sends its next request when the last one ends), `polite`
sends one request at a time (the next one 0.25 s after the last one ended). The polite key's TTFT is measured
alone (`--alone` seconds, the greedy key idle) and then beside the greedy key (`--duration` seconds, from a few
seconds after the greedy streams started, so its backlog is there). The model has `--slots` slots, fewer than
the greedy streams, so requests wait in the engine's queue: that is where the fair share acts.

Two arms, each `llamaray serve-local` (`make run`'s command: topology single, configs/local-cpu.yaml, the
bundled SmolLM2, 2 threads) with the keys file, on a Ray of its own:

- `fair`: the model's `fair_share: true` (the default): the next free slot goes to the key holding fewer;
- `fcfs`: `fair_share: false`: first come, first served over both keys.

Both servers are up at once and take turns: while one is measured every process of the other is stopped
(SIGSTOP), and the order alternates round by round. Writes <out>/tenants.json; logs in <out>/logs/. Exits 1
when an arm did not start or a request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.tenants.policies import key_hash

from .harness.arms import arms_parser, take_turns
from .harness.run import ROOT, free_port, log, run_cli, start_run
from .harness.servers import LlamarayServer
from .load.loadgen import DEFAULT_PROMPTS, RequestResult, chat_payload, chat_url, stream_chat, summarize
from .reports.tables import fmt, write_run

ARMS = {"fair": "fair_share: true (the next slot to the key holding fewer)",
        "fcfs": "fair_share: false (first come, first served)"}
POLITE_PAUSE_S = 0.25  # between the polite key's requests
BACKLOG_S = 3.0        # the greedy streams run this long before the polite key is measured beside them
SEED_BASE = 9000


def keys_file(path: Path) -> dict[str, str]:
    """A keys file of policies with the two keys (random, this run's); returns name -> key."""
    keys = {name: "sk-bench-" + secrets.token_hex(16) for name in ("greedy", "polite")}
    path.write_text(yaml.safe_dump({"keys": [{"name": name, "key_sha256": key_hash(key), "priority": "normal"}
                                             for name, key in keys.items()]}, sort_keys=False))
    return keys


class TenantsServer(LlamarayServer):
    """`llamaray serve-local` on the local CPU config, with the keys file and the arm's fair share."""

    def __init__(self, log_dir: Path, arm: str, keys_path: Path, slots: int) -> None:
        self.arm = arm
        self.name = f"llamaray-{arm}"
        self.config_file = f"serve_bench_tenants_{arm}.yaml"
        self.keys_path = keys_path
        self.slots = slots
        super().__init__(log_dir)

    def prepare(self) -> None:
        self.overlays = ("configs/local-cpu.yaml",)
        self.http_port = free_port()
        super().prepare()
        config = yaml.safe_load(self.config_path.read_text())
        app = config["applications"][0]
        model = app["args"]["models"][0]
        model.update(n_seq_max=self.slots, n_threads=2, n_threads_batch=2, fair_share=self.arm == "fair")
        app["args"]["auth"] = {"required": True, "api_keys_env": None, "api_keys_file": str(self.keys_path)}
        self.config_path.write_text(f"# python -m bench.tenants, arm {self.arm}\n"
                                    + yaml.safe_dump(config, sort_keys=False))
        run_cli([sys.executable, "-m", "app.ops.cli", "check-config", self.config_path])

    def command(self) -> list[str]:
        # `make run`'s command, from this checkout's app/ (the venv's `llamaray` may be another checkout's)
        return [sys.executable, "-m", "app.ops.cli", "serve-local", self.config_path]

    def env(self) -> dict[str, str]:
        env = super().env()
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        return env


# ---- the load ---------------------------------------------------------------------------------------------

async def polite_loop(client: httpx.AsyncClient, url: str, model: str, duration_s: float, max_tokens: int,
                      first_index: int) -> list[RequestResult]:
    results: list[RequestResult] = []
    stop_at = time.perf_counter() + duration_s
    i = first_index
    while time.perf_counter() < stop_at:
        p = i % len(DEFAULT_PROMPTS)
        payload = chat_payload(model, DEFAULT_PROMPTS[p], max_tokens, seed=SEED_BASE + i)
        results.append(await stream_chat(client, url, payload, index=i, prompt_index=p))
        i += 1
        await asyncio.sleep(POLITE_PAUSE_S)
    return results


async def greedy_loop(client: httpx.AsyncClient, url: str, model: str, streams: int, stop: asyncio.Event,
                      max_tokens: int, first_index: int) -> list[RequestResult]:
    results: list[RequestResult] = []
    counter = first_index

    async def stream() -> None:
        nonlocal counter
        while not stop.is_set():
            i = counter
            counter += 1
            p = i % len(DEFAULT_PROMPTS)
            payload = chat_payload(model, DEFAULT_PROMPTS[p], max_tokens, seed=SEED_BASE + i)
            results.append(await stream_chat(client, url, payload, index=i, prompt_index=p))

    await asyncio.gather(*(stream() for _ in range(streams)))
    return results


def _client(key: str, connections: int, timeout_s: float) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), headers={"Authorization": f"Bearer {key}"},
                             limits=httpx.Limits(max_connections=connections + 4))


async def segment(server: TenantsServer, keys: dict[str, str], ns: argparse.Namespace, r: int) -> dict[str, Any]:
    """The polite key alone, then beside the greedy key's streams."""
    url = chat_url(server.base_url)
    first = r * 100_000
    async with _client(keys["polite"], 1, ns.timeout) as polite, _client(keys["greedy"], ns.greedy, ns.timeout) as greedy:
        t0 = time.perf_counter()
        alone = await polite_loop(polite, url, server.model, ns.alone, ns.max_tokens, first)
        alone_wall = time.perf_counter() - t0
        stop = asyncio.Event()
        load = asyncio.create_task(greedy_loop(greedy, url, server.model, ns.greedy, stop, ns.max_tokens,
                                               first + 50_000))
        await asyncio.sleep(BACKLOG_S)
        t0 = time.perf_counter()
        beside = await polite_loop(polite, url, server.model, ns.duration, ns.max_tokens, first + 10_000)
        beside_wall = time.perf_counter() - t0
        stop.set()
        greedy_results = await load
    return {"alone": alone, "alone_wall_s": alone_wall, "beside": beside, "beside_wall_s": beside_wall,
            "greedy": greedy_results, "greedy_wall_s": beside_wall + BACKLOG_S}


def arm_row(arm: str, segments: list[dict[str, Any]]) -> dict[str, Any]:
    def pooled(key: str) -> dict[str, Any]:
        return summarize([x for s in segments for x in s[key]], sum(s[f"{key}_wall_s"] for s in segments))

    alone, beside, greedy = pooled("alone"), pooled("beside"), pooled("greedy")
    p50a, p50b = alone["ttft_ms"]["p50"], beside["ttft_ms"]["p50"]
    return {"arm": arm, "alone_n": alone["n_requests"], "alone_ttft_p50_ms": p50a,
            "alone_ttft_p95_ms": alone["ttft_ms"]["p95"], "beside_n": beside["n_requests"],
            "beside_ttft_p50_ms": p50b, "beside_ttft_p95_ms": beside["ttft_ms"]["p95"],
            "p50_increase": (p50b / p50a - 1) if p50a and p50b else None,
            "greedy_n": greedy["n_requests"], "greedy_tokens_per_s": greedy["tokens_per_s"],
            "greedy_ttft_p50_ms": greedy["ttft_ms"]["p50"],
            "failed": alone["n_failed"] + beside["n_failed"] + greedy["n_failed"],
            "errors": sorted({*alone["errors"], *beside["errors"], *greedy["errors"]})[:5]}


def format_table(rows: list[dict[str, Any]], failures: dict[str, str]) -> str:
    lines = ["| arm | polite alone: TTFT p50 / p95 ms | polite beside greedy: TTFT p50 / p95 ms | p50 increase | "
             "greedy: requests, tok/s, TTFT p50 ms | failed |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['arm']} | {fmt(r['alone_ttft_p50_ms'], '.0f')} / {fmt(r['alone_ttft_p95_ms'], '.0f')} "
                     f"({r['alone_n']}) | {fmt(r['beside_ttft_p50_ms'], '.0f')} / {fmt(r['beside_ttft_p95_ms'], '.0f')} "
                     f"({r['beside_n']}) | {fmt(None if r['p50_increase'] is None else 100 * r['p50_increase'], '+.0f')}% "
                     f"| {r['greedy_n']}, {fmt(r['greedy_tokens_per_s'], '.1f')}, {fmt(r['greedy_ttft_p50_ms'], '.0f')} "
                     f"| {r['failed']} |")
    for name, why in failures.items():
        lines.append(f"{name}: {why}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = arms_parser("python -m bench.tenants", __doc__, ARMS, rounds=1)
    p.add_argument("--alone", type=float, default=15.0, help="seconds the polite key is measured alone")
    p.add_argument("--duration", type=float, default=40.0, help="seconds it is measured beside the greedy key")
    p.add_argument("--greedy", type=int, default=16, help="the greedy key's concurrent streams")
    p.add_argument("--slots", type=int, default=8, help="the model's n_seq_max (fewer than the greedy streams)")
    p.add_argument("--max-tokens", type=int, default=24)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    log_dir = start_run(ns.out)
    keys_path = ROOT / "build" / "bench_tenants_keys.yaml"
    keys_path.parent.mkdir(parents=True, exist_ok=True)
    keys = keys_file(keys_path)
    def measured(arm: str, server: TenantsServer, n: int) -> dict[str, Any]:
        log(f"{arm}: segment {n // len(ns.arms) + 1} of {ns.rounds}")
        seg = asyncio.run(segment(server, keys, ns, n))
        row = arm_row(arm, [seg])
        log(f"{arm}: polite TTFT p50 alone {row['alone_ttft_p50_ms']} ms, beside {row['beside_ttft_p50_ms']} ms")
        return seg

    segments, failures = take_turns(ns.arms, ns.rounds, lambda arm: TenantsServer(log_dir, arm, keys_path, ns.slots),
                                    measured)
    rows = [arm_row(arm, segs) for arm, segs in segments.items() if segs]
    print(format_table(rows, failures), flush=True)
    raw = {arm: [{k: ([x.to_dict() for x in v] if isinstance(v, list) else v) for k, v in s.items()} for s in segs]
           for arm, segs in segments.items()}
    write_run(ns.out / "tenants.json", ns, arms={a: ARMS[a] for a in ns.arms}, rows=rows, failures=failures,
              segments=raw)
    return 1 if failures or not rows or any(r["failed"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
