"""What a load test records while it runs (`RunLog`), and the report made from it: one JSON
document (config, per-second timeline, totals) and one PNG with four panels.

All times in the log are `time.perf_counter()` values, the clock `bench.load.loadgen` stamps requests
with; the report turns them into seconds since the start. The PNG is drawn from the JSON
document alone, so a saved report can be re-plotted (`plot(json.load(f), path)`).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..loadgen import RequestResult, percentile, summarize

from .serve_status import DeploymentReplicas
from .workload import Schedule

REPORT_VERSION = 1
TOP_REASONS = 10


@dataclass
class RunLog:
    """Everything observed during one run. Written from the event loop only (no locks)."""

    t0: float
    schedule: Schedule
    results: list[RequestResult] = field(default_factory=list)         # in completion order
    in_flight: dict[int, RequestResult] = field(default_factory=dict)  # live, filled as chunks arrive
    drops: list[float] = field(default_factory=list)
    replica_samples: list[tuple[float, dict[str, DeploymentReplicas]]] = field(default_factory=list)
    n_failed: int = 0
    _tokens: int = 0
    _chunks: int = 0

    def on_start(self, res: RequestResult) -> None:
        self.in_flight[res.index] = res

    def on_result(self, res: RequestResult) -> None:
        self.in_flight.pop(res.index, None)
        self.results.append(res)
        self.n_failed += not res.ok
        self._tokens += res.completion_tokens
        self._chunks += res.n_chunks

    def on_drop(self, t: float) -> None:
        self.drops.append(t)

    def on_replicas(self, t: float, sample: dict[str, DeploymentReplicas]) -> None:
        self.replica_samples.append((t, sample))

    @property
    def latest_replicas(self) -> dict[str, DeploymentReplicas] | None:
        return self.replica_samples[-1][1] if self.replica_samples else None

    def tokens_per_chunk(self) -> float:
        """Servers may pack several tokens in one chunk; the usage chunk (at the end of a stream)
        tells how many. Used to estimate the tokens of streams still running."""
        return self._tokens / self._chunks if self._chunks else 1.0

    def window(self, now: float, seconds: float = 5.0) -> tuple[float, float | None]:
        """(tokens/s, TTFT p50 in s) over the last `seconds`, counting streams still running."""
        lo = now - seconds
        tokens = 0.0
        ttfts: list[float] = []
        live_ratio = self.tokens_per_chunk()

        def count(res: RequestResult, per_chunk: float) -> None:
            nonlocal tokens
            tokens += per_chunk * sum(1 for c in res.content_times if res.start + c >= lo)
            if res.ttft_s is not None and res.start + res.ttft_s >= lo:
                ttfts.append(res.ttft_s)

        for res in reversed(self.results):
            if res.end < lo:
                break
            count(res, res.completion_tokens / res.n_chunks if res.n_chunks else 0.0)
        for res in list(self.in_flight.values()):
            count(res, live_ratio)
        span = min(seconds, max(now - self.t0, 1e-3))   # the first seconds of a run are shorter
        return tokens / span, percentile(ttfts, 50)


def _ms(values: list[float], q: float) -> float | None:
    v = percentile(values, q)
    return None if v is None else round(v * 1000, 3)


def _bucket(t: float, n: int) -> int:
    return min(max(int(t), 0), n - 1)


def timeline(log: RunLog, wall_s: float, *, level_unit: str,
             replica_max_age_s: float = 3.0) -> list[dict[str, Any]]:
    """One entry per second of the run: entry i covers [i, i+1) s. Requests count where they
    start, complete (ok) or fail; tokens where their chunks arrived; TTFT where the first token
    arrived; end-to-end latency where the request ended. `level` is the schedule's value at the
    middle of the second (None while draining after the schedule); replicas are the last sample
    taken in or before the second, if no older than `replica_max_age_s`."""
    n = max(1, math.ceil(wall_s))
    started = [0] * n
    done = [0] * n
    failed = [0] * n
    failed_by: list[Counter[str]] = [Counter() for _ in range(n)]
    tokens = [0.0] * n
    ttft: list[list[float]] = [[] for _ in range(n)]
    e2e: list[list[float]] = [[] for _ in range(n)]
    dropped = [0] * n

    live_ratio = log.tokens_per_chunk()
    for res, finished in [*((r, True) for r in log.results),
                          *((r, False) for r in log.in_flight.values())]:
        s = res.start - log.t0
        started[_bucket(s, n)] += 1
        if res.ttft_s is not None:
            ttft[_bucket(s + res.ttft_s, n)].append(res.ttft_s)
        per_chunk = (res.completion_tokens / res.n_chunks if res.n_chunks else 0.0) if finished else live_ratio
        for c in res.content_times:
            tokens[_bucket(s + c, n)] += per_chunk
        if finished:
            b = _bucket(res.end - log.t0, n)
            e2e[b].append(res.latency_s)
            if res.ok:
                done[b] += 1
            else:
                failed[b] += 1
                failed_by[b][res.outcome] += 1
    for t in log.drops:
        dropped[_bucket(t - log.t0, n)] += 1

    out = []
    in_flight = 0
    sample_i = 0
    last_sample: tuple[float, dict[str, DeploymentReplicas]] | None = None
    for i in range(n):
        in_flight += started[i] - done[i] - failed[i]
        while sample_i < len(log.replica_samples) and log.replica_samples[sample_i][0] - log.t0 < i + 1:
            last_sample = log.replica_samples[sample_i]
            sample_i += 1
        replicas = None
        if last_sample is not None and (i + 1) - (last_sample[0] - log.t0) <= replica_max_age_s + 1:
            replicas = {k: {"running": d.running, "starting": d.starting, "target": d.target}
                        for k, d in last_sample[1].items()}
        level = log.schedule.level_at(i + 0.5)
        if level is not None and level_unit == "concurrency":
            level = math.floor(level + 0.5)
        out.append({
            "t": i,
            "level": level,
            "started": started[i],
            "completed": done[i],
            "failed": failed[i],
            "failed_by_outcome": dict(sorted(failed_by[i].items())),
            "dropped": dropped[i],
            "in_flight": in_flight,
            "completion_tokens": round(tokens[i], 3),
            "ttft_p50_ms": _ms(ttft[i], 50),
            "ttft_p95_ms": _ms(ttft[i], 95),
            "e2e_p50_ms": _ms(e2e[i], 50),
            "e2e_p95_ms": _ms(e2e[i], 95),
            "replicas": replicas,
        })
    return out


def failed_reasons(results: Iterable[RequestResult]) -> list[dict[str, Any]]:
    """The most common (outcome, error message) pairs of failed requests, most frequent first."""
    reasons = Counter((r.outcome, (r.error or "")[:160]) for r in results if not r.ok)
    return [{"outcome": o, "error": e, "count": c} for (o, e), c in reasons.most_common(TOP_REASONS)]


def max_replicas(log: RunLog) -> dict[str, int]:
    out: dict[str, int] = {}
    for _, sample in log.replica_samples:
        for key, d in sample.items():
            out[key] = max(out.get(key, 0), d.running)
    return dict(sorted(out.items()))


def build_report(log: RunLog, wall_s: float, *, config: dict[str, Any], serve: dict[str, Any] | None,
                 interrupted: bool) -> dict[str, Any]:
    totals = summarize(log.results, wall_s)
    totals.update(
        dropped=len(log.drops),
        cancelled=len(log.in_flight),   # still running when a second Ctrl-C cut the run short
        failed_reasons=failed_reasons(log.results),
        max_replicas=max_replicas(log),
    )
    return {
        "version": REPORT_VERSION,
        "config": config,
        "interrupted": interrupted,
        "wall_s": round(wall_s, 3),
        "serve": serve,
        "totals": totals,
        "timeline": timeline(log, wall_s, level_unit=config.get("level_unit", "concurrency")),
    }


def write_json(report: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    return path


def _rolling_mean(values: list[float], width: int = 5) -> list[float]:
    """Centered moving average (a trailing one would shift peaks `width / 2` s late)."""
    half = width // 2
    out = []
    for i in range(len(values)):
        window = values[max(0, i - half):i + half + 1]
        out.append(sum(window) / len(window))
    return out


def short_names(keys: Iterable[str]) -> dict[str, str]:
    """Drop the application prefix when every deployment is in the same application."""
    keys = list(keys)
    apps = {k.split("/", 1)[0] for k in keys}
    return {k: k.split("/", 1)[-1] if len(apps) == 1 else k for k in keys}


def plot(report: dict[str, Any], path: Path) -> Path:
    """Four panels over time: (a) replicas per deployment with the offered load, (b) tokens/s and
    requests/s, (c) TTFT and end-to-end latency p50/p95, (d) failed and dropped requests.
    Needs matplotlib (imported here, so `app` itself does not depend on it)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = report["timeline"]
    t = [b["t"] + 0.5 for b in tl]
    unit = report["config"].get("level_unit", "concurrency")
    fig, axes = plt.subplots(4, 1, figsize=(11, 13), sharex=True)
    ax_a, ax_b, ax_c, ax_d = axes
    title = f"{report['config'].get('model', '')} @ {report['config'].get('url', '')}"
    fig.suptitle(f"load test: {title}" + (" (interrupted)" if report.get("interrupted") else ""))

    # (a) replicas, with the load on a second axis: scaling shows as replicas following the load.
    keys = sorted({k for b in tl if b["replicas"] for k in b["replicas"]})
    names = short_names(keys)
    for key in keys:
        running = [b["replicas"][key]["running"] if b["replicas"] and key in b["replicas"] else math.nan
                   for b in tl]
        line, = ax_a.step(t, running, where="mid", label=f"{names[key]} running")
        target = [b["replicas"][key]["target"] if b["replicas"] and key in b["replicas"]
                  and b["replicas"][key]["target"] is not None else math.nan for b in tl]
        ax_a.step(t, target, where="mid", linestyle=":", color=line.get_color(), alpha=0.7)
    if not keys:
        ax_a.text(0.5, 0.5, "no replica data (Serve dashboard not polled or not reachable)",
                  transform=ax_a.transAxes, ha="center", va="center", color="gray")
    ax_a.set_ylabel("replicas (dotted: target)")
    ax_a.set_ylim(bottom=0)
    ax_l = ax_a.twinx()
    ax_l.plot(t, [math.nan if b["level"] is None else b["level"] for b in tl], color="black",
              linestyle="--", linewidth=1, label=f"target {unit}")
    ax_l.plot(t, [b["in_flight"] for b in tl], color="gray", linewidth=0.8, alpha=0.6, label="in flight")
    ax_l.set_ylabel(unit)
    ax_l.set_ylim(bottom=0)
    handles = ax_a.get_legend_handles_labels()[0] + ax_l.get_legend_handles_labels()[0]
    ax_a.legend(handles=handles, loc="upper left", fontsize=8)
    ax_a.set_title("(a) replicas per deployment", loc="left", fontsize=10)

    # (b) throughput: per-second values are lumpy (requests end in bursts), so a 5 s mean on top.
    toks = [b["completion_tokens"] for b in tl]
    reqs = [b["completed"] + b["failed"] for b in tl]
    ax_b.plot(t, toks, color="tab:blue", alpha=0.25, linewidth=0.8)
    ax_b.plot(t, _rolling_mean(toks), color="tab:blue", label="tokens/s (5 s mean)")
    ax_b.set_ylabel("tokens/s")
    ax_b.set_ylim(bottom=0)
    ax_r = ax_b.twinx()
    ax_r.plot(t, _rolling_mean(reqs), color="tab:orange", label="requests/s ended (5 s mean)")
    ax_r.set_ylabel("requests/s")
    ax_r.set_ylim(bottom=0)
    ax_b.legend(handles=ax_b.get_legend_handles_labels()[0] + ax_r.get_legend_handles_labels()[0],
                loc="upper left", fontsize=8)
    ax_b.set_title("(b) throughput", loc="left", fontsize=10)

    # (c) latency percentiles per second (gaps where nothing arrived/ended that second)
    for key, label, style in (("ttft_p50_ms", "TTFT p50", "-"), ("ttft_p95_ms", "TTFT p95", ":"),
                              ("e2e_p50_ms", "end-to-end p50", "-"), ("e2e_p95_ms", "end-to-end p95", ":")):
        ys = [math.nan if b[key] is None else b[key] / 1000 for b in tl]
        ax_c.plot(t, ys, linestyle=style, marker=".", markersize=3,
                  color="tab:green" if key.startswith("ttft") else "tab:purple", label=label)
    ax_c.set_ylabel("seconds")
    ax_c.set_ylim(bottom=0)
    ax_c.legend(loc="upper left", fontsize=8)
    ax_c.set_title("(c) latency percentiles", loc="left", fontsize=10)

    # (d) errors: failed requests stacked by outcome, plus open-loop arrivals dropped at the cap
    outcomes = sorted({o for b in tl for o in b["failed_by_outcome"]})
    bottom = [0.0] * len(tl)
    for outcome in outcomes:
        ys = [b["failed_by_outcome"].get(outcome, 0) for b in tl]
        ax_d.bar(t, ys, width=1.0, bottom=bottom, label=outcome)
        bottom = [a + b for a, b in zip(bottom, ys)]
    if any(b["dropped"] for b in tl):
        ax_d.bar(t, [b["dropped"] for b in tl], width=1.0, bottom=bottom, color="lightgray",
                 label="dropped (in-flight cap)")
    if ax_d.get_legend_handles_labels()[0]:
        ax_d.legend(loc="upper left", fontsize=8)
    else:
        ax_d.text(0.5, 0.5, "no failed requests", transform=ax_d.transAxes, ha="center",
                  va="center", color="gray")
    ax_d.set_ylabel("requests/s")
    ax_d.set_xlabel("seconds since start")
    ax_d.set_title("(d) failed requests", loc="left", fontsize=10)

    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
