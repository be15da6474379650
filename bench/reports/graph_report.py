"""The graph bench's outputs (python -m bench.graph): one record per level made from what the load
generator, /proc and the engine said about the same window; the tables; the targets; the sizing lines."""

from __future__ import annotations

import math
from typing import Any

from ..harness.procs import SERVING, TIERS, per_k_tokens
from .tables import fmt, text_table

# The targets, with one replica of each CPU tier at 64 streams: the H200's measured rate delivered.
TARGET_REPLICAS = 1
TARGET_STREAMS = 64
TARGET_RATE = 3368.0          # tok/s: the H200 figure at 64 streams (app/config/resolution.py SYNTHETIC_PRESETS)
TARGET_DELIVERED = 0.95       # of the engine's tokens (and of that rate)
TARGET_GAP_ADDED_MS = 100.0   # inter-chunk p99 added to the engine's own chunk interval
# The engine's own time to a first token: the request waits for the step under way (half a step on
# average), is admitted (its prompt prefilled) in the next, and gets its first token in the one after.
ENGINE_TTFT_STEPS = 2.5
OTHER_LOAD_WARN = 0.2         # cores other processes used during a level that make it suspect

TIER_LABELS = {"ingress": "Ingress", "chat_processor": "ChatProc", "proxy": "proxy", "model": "model(Ray)",
               "ray_other": "Ray other", "loadgen": "loadgen", "bench": "bench"}


def engine_gap_s(window_s: float, step_s: float) -> float:
    """How far apart the model replica sends a stream's chunks: a chunk leaves on the end of the last
    engine step that fits the coalescing window (app/engine/stream.py), and at least one step apart."""
    if step_s <= 0:
        return window_s
    return max(step_s, math.floor(window_s / step_s + 1e-9) * step_s)


def level_record(*, replicas: int, streams: int, load: dict[str, Any], cpu_s: dict[str, float],
                 ray_other: dict[str, float], machine_cpu_s: float, cpu_window_s: float,
                 engine_before: dict[str, Any], engine_after: dict[str, Any], engine_window_s: float,
                 step_s: float, prefill_s: float, coalescing_s: float) -> dict[str, Any]:
    """One level's figures. `load`: the load generator's (bench/load/graph_load.py); `cpu_s`: CPU seconds per
    tier over `cpu_window_s`; `machine_cpu_s`: the whole machine's busy CPU seconds over it; the engine's
    stats before and after, `engine_window_s` apart; the synthetic engine's nominal `step_s` at this many
    streams, its prefill time for one prompt, and the model replica's coalescing window."""
    tokens = load["tokens"]
    window = load["window_s"]
    engine_tokens = engine_after["tokens_decoded"] - engine_before["tokens_decoded"]
    engine_steps = engine_after["steps"] - engine_before["steps"]
    engine_tps = engine_tokens / engine_window_s if engine_window_s > 0 else None
    delivered_tps = load["tokens_per_s"]
    engine_ttft_ms = (ENGINE_TTFT_STEPS * step_s + prefill_s) * 1000
    engine_gap_ms = engine_gap_s(coalescing_s, step_s) * 1000
    ttft, gap = load["ttft_ms"], load["gap_ms"]
    accounted = sum(cpu_s.values())
    chunks = load["chunks"]
    # At the engine's own pace a stream gets one chunk per engine_gap; a graph that falls behind hands
    # out bigger ones (fewer Ray items per token): CPU per chunk at that pace is the figure to size by.
    nominal_per_chunk = engine_gap_ms / (step_s * 1000) if step_s else None
    per_chunk_ms = {t: v * 1000 / chunks if chunks else None for t, v in cpu_s.items()}
    return {
        "replicas": replicas, "streams": streams, "window_s": window,
        "delivered": {"tokens": tokens, "tokens_per_s": delivered_tps, "chunks_per_s": load["chunks_per_s"],
                      "tokens_per_chunk": tokens / load["chunks"] if load["chunks"] else None},
        "engine": {"tokens": engine_tokens, "tokens_per_s": engine_tps, "steps": engine_steps,
                   "mean_batch": engine_tokens / engine_steps if engine_steps else None,
                   "mean_step_ms": engine_window_s * 1000 / engine_steps if engine_steps else None,
                   "nominal_step_ms": step_s * 1000, "nominal_tokens_per_s": streams / step_s if step_s else None},
        "delivered_of_engine": delivered_tps / engine_tps if delivered_tps is not None and engine_tps else None,
        "ttft_ms": ttft, "engine_ttft_ms": engine_ttft_ms,
        "ttft_added_ms": {q: (ttft.get(q) - engine_ttft_ms if ttft.get(q) is not None else None)
                          for q in ("p50", "p99")},
        "gap_ms": gap, "engine_gap_ms": engine_gap_ms,
        "gap_added_p99_ms": gap["p99"] - engine_gap_ms if gap.get("p99") is not None else None,
        "cpu_s": {t: round(v, 3) for t, v in cpu_s.items()},
        "cores": {t: round(v / cpu_window_s, 3) for t, v in cpu_s.items()} if cpu_window_s > 0 else {},
        "cpu_s_per_1k_tokens": {t: per_k_tokens(v, tokens) for t, v in cpu_s.items()},
        "cpu_ms_per_chunk": per_chunk_ms,
        "nominal_tokens_per_chunk": nominal_per_chunk,
        "cpu_s_per_1k_tokens_nominal": {t: (v / nominal_per_chunk if v is not None and nominal_per_chunk else None)
                                        for t, v in per_chunk_ms.items()},
        "ray_other_cpu_s": {k: round(v, 3) for k, v in sorted(ray_other.items(), key=lambda kv: -kv[1])},
        "other_cores": round(max(machine_cpu_s - accounted, 0.0) / cpu_window_s, 3) if cpu_window_s > 0 else None,
        "requests_sent": load["requests_sent"], "outcomes": load["outcomes"], "errors": load["errors"],
        "failed": sum(n for k, n in load["outcomes"].items() if k != "ok"),
        "ttft_missing": load["ttft_missing"], "token_count_mismatches": load["token_count_mismatches"],
    }


def format_tables(levels: list[dict[str, Any]], idle: dict[int, dict[str, float]] | None = None) -> str:
    """Two tables: what the clients got, and where the CPU went (seconds per 1,000 delivered tokens,
    which is also cores per 1,000 tok/s); then the cores each tier used idle, per replica count."""
    head = ("R", "streams", "tok/s", "engine tok/s", "deliv/eng", "chunks/s", "tok/chunk", "TTFT p50",
            "TTFT p99", "+TTFT p50", "gap p99", "+gap p99", "failed")
    body = [(str(lv["replicas"]), str(lv["streams"]), fmt(lv["delivered"]["tokens_per_s"]),
             fmt(lv["engine"]["tokens_per_s"]), fmt(lv["delivered_of_engine"], ".3f"),
             fmt(lv["delivered"]["chunks_per_s"]), fmt(lv["delivered"]["tokens_per_chunk"], ".1f"),
             fmt(lv["ttft_ms"]["p50"]), fmt(lv["ttft_ms"]["p99"]), fmt(lv["ttft_added_ms"]["p50"]),
             fmt(lv["gap_ms"]["p99"]), fmt(lv["gap_added_p99_ms"]), str(lv["failed"])) for lv in levels]
    lines = ["delivered to clients (ms; + = added by the graph to the engine's own TTFT / chunk interval)"]
    lines += text_table(head, body, left=())
    tiers = [t for t in TIERS if any(lv["cpu_s"].get(t) for lv in levels)]
    head2 = ("R", "streams", *(TIER_LABELS[t] for t in tiers), "serving", "ms/chunk", "at pace",
             "cores srv/gen/other")
    body2 = []
    for lv in levels:
        per = lv["cpu_s_per_1k_tokens"]
        cores = lv["cores"]
        srv = sum(cores.get(t, 0.0) for t in SERVING)
        flag = " !" if (lv["other_cores"] or 0) > OTHER_LOAD_WARN else ""
        body2.append((str(lv["replicas"]), str(lv["streams"]), *(fmt(per.get(t), ".3f") for t in tiers),
                      fmt(serving_cpu_per_1k(lv), ".3f"), fmt(serving_sum(lv["cpu_ms_per_chunk"]), ".2f"),
                      fmt(serving_cpu_per_1k(lv, nominal=True), ".3f"),
                      f"{srv:.2f}/{cores.get('loadgen', 0.0):.2f}/{fmt(lv['other_cores'], '.2f')}{flag}"))
    lines += ["", "CPU seconds per 1,000 delivered tokens (= cores per 1,000 tok/s); serving = the server's tiers "
              "together, also per content chunk, and per 1,000 tokens at the engine's own pace (chunks of "
              "window/step tokens: a graph that falls behind sends bigger ones, which cost less per token)"]
    lines += text_table(head2, body2, left=())
    for replicas, cores in (idle or {}).items():
        lines.append(f"idle, R={replicas}: " + ", ".join(f"{TIER_LABELS[t]} {v:.3f}" for t, v in cores.items())
                     + f" cores (serving {sum(cores.values()):.3f})")
    if any((lv["other_cores"] or 0) > OTHER_LOAD_WARN for lv in levels):
        lines.append(f"! other processes used > {OTHER_LOAD_WARN} cores during a level marked '!': its rates "
                     "are lower than on a quiet machine (its CPU per token much less so)")
    bad = [lv for lv in levels if lv["token_count_mismatches"] or lv["ttft_missing"]]
    for lv in bad:
        lines.append(f"R={lv['replicas']} streams={lv['streams']}: {lv['token_count_mismatches']} replies whose "
                     f"token count the bench could not check, {lv['ttft_missing']} requests without a first token "
                     "by the window's end")
    return "\n".join(lines)


def serving_sum(per_tier: dict[str, float | None]) -> float | None:
    values = [per_tier.get(t) for t in SERVING if per_tier.get(t) is not None]
    return sum(values) if values else None


def serving_cpu_per_1k(lv: dict[str, Any], nominal: bool = False) -> float | None:
    """The server's CPU seconds per 1,000 tokens, as delivered or at the engine's own pace."""
    return serving_sum(lv["cpu_s_per_1k_tokens_nominal" if nominal else "cpu_s_per_1k_tokens"])


def target_checks(levels: list[dict[str, Any]]) -> list[tuple[bool, str]]:
    """(met, description) for the targets this run can check: with one replica of each CPU tier at 64
    streams, the H200's rate delivered, >= 95% of the engine's tokens delivered, inter-chunk p99 at most
    100 ms over the engine's own chunk interval."""
    out = []
    for lv in levels:
        if lv["replicas"] != TARGET_REPLICAS or lv["streams"] != TARGET_STREAMS:
            continue
        tps = lv["delivered"]["tokens_per_s"] or 0.0
        out.append((tps >= TARGET_DELIVERED * TARGET_RATE,
                    f"R=1 streams=64: {tps:.0f} tok/s delivered (>= {TARGET_DELIVERED:.0%} of the H200's "
                    f"{TARGET_RATE:.0f})"))
        share = lv["delivered_of_engine"]
        out.append((share is not None and share >= TARGET_DELIVERED,
                    f"R=1 streams=64: {fmt(share, '.3f')} of the engine's tokens delivered (>= {TARGET_DELIVERED})"))
        added = lv["gap_added_p99_ms"]
        out.append((added is not None and added <= TARGET_GAP_ADDED_MS,
                    f"R=1 streams=64: inter-chunk p99 {fmt(lv['gap_ms']['p99'])} ms, {fmt(added)} ms over the engine's "
                    f"{lv['engine_gap_ms']:.0f} ms (<= {TARGET_GAP_ADDED_MS:.0f} added)"))
        out.append((lv["failed"] == 0, f"R=1 streams=64: failed streams {lv['failed']} (0)"))
    return out


def sizing(levels: list[dict[str, Any]], rate: float = TARGET_RATE) -> list[str]:
    """Cores per 1,000 tok/s of each serving tier (the level of the target when it ran, else the busiest
    level with one replica each), and what `rate` tok/s needs of each."""
    pick = [lv for lv in levels if lv["replicas"] == TARGET_REPLICAS and lv["streams"] == TARGET_STREAMS]
    pick = pick or sorted((lv for lv in levels if lv["replicas"] == TARGET_REPLICAS),
                          key=lambda lv: -(lv["delivered"]["tokens_per_s"] or 0))
    if not pick:
        return []
    lv = pick[0]
    per = lv["cpu_s_per_1k_tokens_nominal"]
    lines = [f"sizing (from R={lv['replicas']} streams={lv['streams']}, CPU per chunk at the engine's own pace of "
             f"{fmt(lv['nominal_tokens_per_chunk'], '.1f')} tokens a chunk): cores per 1,000 tok/s, and at {rate:.0f} tok/s"]
    for tier in ("chat_processor", "ingress", "proxy", "model", "ray_other"):
        v = per.get(tier)
        if v is not None and lv["cpu_s"].get(tier):
            lines.append(f"  {TIER_LABELS[tier]:<11} {v:.3f} per 1,000 tok/s   {v * rate / 1000:.2f} cores")
    total = serving_cpu_per_1k(lv, nominal=True)
    if total is not None:
        lines.append(f"  {'serving':<11} {total:.3f} per 1,000 tok/s   {total * rate / 1000:.2f} cores")
    return lines
