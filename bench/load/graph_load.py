"""python -m bench.load.graph_load: the graph bench's load generator, a process of its own (its CPU time is
one of the tiers the bench accounts for, and it shares no interpreter with the bench's Ray driver).

`--streams` closed-loop streamed chat completions (bench.load.loadgen.stream_chat), started spread over
`--ramp-s` so that they do not finish in waves, spread over `--urls` (one per direct-ingress replica, or
Serve's proxy). After `--warmup-s` it prints `WINDOW START`, after `--measure-s` more `WINDOW END`
(the bench samples /proc and the engine at each line), keeps streaming `--tail-s` so that requests
started in the window get their first token, then cancels what is left and writes its figures (JSON)
to `--out`. Every figure is of the window alone:

- tokens: exact, from the synthetic engine's replies, where each token is one word and one space
  (app/engine/synthetic.py WORDS): the spaces each stream had received at the window's end minus at
  its start. Checked against `usage.completion_tokens` of the requests that completed
  (`token_count_mismatches`).
- chunks: SSE chunks with content received in the window.
- TTFT: of the requests sent in the window; inter-chunk gaps: of consecutive content chunks both in it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from .loadgen import DEFAULT_PROMPTS, RequestResult, chat_payload, chat_url, percentile, stream_chat

SEED_BASE = 7000


def tokens_in(text: str) -> int:
    """Tokens of a synthetic reply's text: one word and one space each."""
    return text.count(" ")


def dist_ms(values: list[float]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(values)}
    for q in (50, 90, 99):
        v = percentile(values, q)
        out[f"p{q}"] = None if v is None else round(v * 1000, 1)
    out["max"] = round(max(values) * 1000, 1) if values else None
    return out


def window_figures(results: list[RequestResult], t0: float, t1: float, at_t0: dict[int, int],
                   at_t1: dict[int, int]) -> dict[str, Any]:
    """The window [t0, t1)'s figures from every request's result (times are perf_counter values) and the
    tokens each had received at t0 and at t1 (by the result's id(); absent: not started yet)."""
    tokens = sum(at_t1.get(id(r), 0) - at_t0.get(id(r), 0) for r in results)
    chunks, gaps, ttfts, missing = 0, [], [], 0
    for r in results:
        times = [r.start + t for t in r.content_times]
        inside = [t for t in times if t0 <= t < t1]
        chunks += len(inside)
        gaps += [b - a for a, b in zip(inside, inside[1:])]
        if t0 <= r.start < t1:
            if r.ttft_s is not None:
                ttfts.append(r.ttft_s)
            else:
                missing += 1
    ended = [r for r in results if r.end and t0 <= r.end < t1]
    mismatches = sum(1 for r in results if r.ok and r.tokens_from_usage and tokens_in(r.text) != r.completion_tokens)
    window = t1 - t0
    return {"window_s": round(window, 3), "tokens": tokens, "chunks": chunks,
            "tokens_per_s": tokens / window if window > 0 else None,
            "chunks_per_s": chunks / window if window > 0 else None,
            "ttft_ms": dist_ms(ttfts), "ttft_missing": missing, "gap_ms": dist_ms(gaps),
            "requests_sent": sum(1 for r in results if t0 <= r.start < t1),
            "requests_ended": len(ended),
            "outcomes": dict(Counter(r.outcome for r in ended)),
            "errors": sorted({r.error for r in ended if r.error})[:5],
            "token_count_mismatches": mismatches}


async def run(ns: argparse.Namespace) -> dict[str, Any]:
    urls = [chat_url(u) for u in ns.urls.split(",")]
    results: list[RequestResult] = []
    stop_sending = asyncio.Event()
    counter = iter(range(10**9))
    client = httpx.AsyncClient(timeout=httpx.Timeout(ns.timeout, connect=10.0),
                               limits=httpx.Limits(max_connections=ns.streams + 4,
                                                   max_keepalive_connections=ns.streams + 4))

    async def worker(w: int) -> None:
        await asyncio.sleep(ns.ramp_s * w / ns.streams)
        while not stop_sending.is_set():
            i = next(counter)
            payload = chat_payload(ns.model, DEFAULT_PROMPTS[i % len(DEFAULT_PROMPTS)], ns.max_tokens,
                                   temperature=ns.temperature, seed=SEED_BASE + i)
            await stream_chat(client, urls[w % len(urls)], payload, index=i, prompt_index=i % len(DEFAULT_PROMPTS),
                              on_start=results.append, keep_text=True)

    def counts() -> dict[int, int]:
        return {id(r): tokens_in(r.text) for r in results}

    tasks = [asyncio.create_task(worker(w)) for w in range(ns.streams)]
    try:
        await asyncio.sleep(ns.warmup_s)
        t0, at_t0 = time.perf_counter(), counts()
        print("WINDOW START", flush=True)
        await asyncio.sleep(ns.measure_s)
        t1, at_t1 = time.perf_counter(), counts()
        print("WINDOW END", flush=True)
        await asyncio.sleep(ns.tail_s)
        stop_sending.set()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.aclose()
    return window_figures(results, t0, t1, at_t0, at_t1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.load.graph_load", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--urls", required=True, help="comma-separated server roots; streams take them in turn")
    p.add_argument("--model", required=True)
    p.add_argument("--streams", type=int, required=True)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--ramp-s", type=float, default=5.0)
    p.add_argument("--warmup-s", type=float, default=10.0)
    p.add_argument("--measure-s", type=float, default=30.0)
    p.add_argument("--tail-s", type=float, default=2.0)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--out", type=Path, required=True)
    ns = p.parse_args(argv)
    try:
        import uvloop  # noqa: PLC0415 - a cheaper event loop when installed (Ray Serve brings it)
        figures = uvloop.run(run(ns))
    except ImportError:
        figures = asyncio.run(run(ns))
    ns.out.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
