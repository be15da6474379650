"""`python -m bench`'s outputs: one text table, the same as JSON (write_json), and a PNG chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .tables import fmt, text_table, write_json  # noqa: F401 - re-exported: python -m bench writes its JSON with it


OTHER_LOAD_WARN = 0.2   # cores used by other processes during a level that make it suspect


def _cores(cpu: dict | None) -> str:
    if not cpu:
        return "-"
    flag = " !" if cpu["other_cores"] > OTHER_LOAD_WARN else ""
    return f"{cpu['server_cores']:.2f}/{cpu['loadgen_cores']:.2f}/{cpu['other_cores']:.2f}{flag}"


def rows(levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One flat row per (server, concurrency) from the per-level summaries."""
    out = []
    for lv in levels:
        s = lv["summary"]
        out.append({
            "server": lv["server"],
            "concurrency": lv["concurrency"],
            "requests": s["n_requests"],
            "tokens_per_s": s["tokens_per_s"],
            "ttft_p50_ms": s["ttft_ms"]["p50"],
            "ttft_p95_ms": s["ttft_ms"]["p95"],
            "itl_p50_ms": s["itl_ms"]["p50"],
            "gap_p99_ms": s["chunk_gap_ms"]["p99"],
            "failed_or_cut": s["n_failed"],
            "outcomes": s["outcomes"],
            "mean_completion_tokens": s["mean_completion_tokens"],
            "completion_tokens_source": s["completion_tokens_source"],
            "wall_s": s["wall_s"],
            "cpu": lv.get("cpu"),
            "tokens_per_s_rounds": lv.get("tokens_per_s_rounds"),
        })
    return out


def ratios(table: list[dict[str, Any]], ours: str = "llamaray", skip: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """`ours` / peer for tokens/s (> 1: ours faster) and TTFT p50 (< 1: ours faster), for every peer but
    those in `skip`."""
    by_key = {(r["server"], r["concurrency"]): r for r in table}
    out = []
    for r in table:
        if r["server"] == ours or r["server"] in skip:
            continue
        mine = by_key.get((ours, r["concurrency"]))
        if mine is None:
            continue

        def ratio(key: str) -> float | None:
            a, b = mine[key], r[key]
            return a / b if a is not None and b else None

        # Round by round, where both ran the same rounds: how far the pooled ratio moves between them.
        ours_k, theirs_k = mine.get("tokens_per_s_rounds") or [], r.get("tokens_per_s_rounds") or []
        per_round = ([a / b if b else None for a, b in zip(ours_k, theirs_k)]
                     if len(ours_k) == len(theirs_k) > 1 else None)
        out.append({"ours": ours, "peer": r["server"], "concurrency": r["concurrency"],
                    "tokens_per_s": ratio("tokens_per_s"), "ttft_p50": ratio("ttft_p50_ms"),
                    "tokens_per_s_rounds": per_round})
    return out


def format_table(table: list[dict[str, Any]], ratio_rows: list[dict[str, Any]],
                 failures: dict[str, str] | None = None) -> str:
    head = ("server", "conc", "reqs", "tok/s", "TTFT p50 ms", "TTFT p95 ms", "ITL p50 ms", "gap p99 ms",
            "failed/cut", "tokens from", "cores srv/gen/other")
    body = []
    for r in table:
        cut = str(r["failed_or_cut"])
        if r["failed_or_cut"]:
            bad = {k: v for k, v in r["outcomes"].items() if k != "ok"}
            cut += " (" + ", ".join(f"{k} {v}" for k, v in bad.items()) + ")"
        body.append((r["server"], str(r["concurrency"]), str(r["requests"]), fmt(r["tokens_per_s"], ".1f"),
                     fmt(r["ttft_p50_ms"]), fmt(r["ttft_p95_ms"]), fmt(r["itl_p50_ms"], ".1f"),
                     fmt(r.get("gap_p99_ms")), cut,
                     str(r["completion_tokens_source"]), _cores(r.get("cpu"))))
    lines = text_table(head, body, left=(0, 8, 9, 10))
    by_round = [r for r in table if len(r.get("tokens_per_s_rounds") or ()) > 1]
    if by_round:
        lines += ["", "tok/s of each round (the rows pool the rounds)"]
        lines += [f"  {r['server']:<17} c={r['concurrency']:<3} "
                  + " / ".join(f"{v:.1f}" for v in r["tokens_per_s_rounds"]) for r in by_round]
    for ours in dict.fromkeys(x.get("ours", "llamaray") for x in ratio_rows):
        lines += ["", f"{ours} / peer (tok/s: > 1 is {ours} faster; TTFT p50: < 1 is {ours} faster)"]
        for x in ratio_rows:
            if x.get("ours", "llamaray") != ours:
                continue
            rounds = x.get("tokens_per_s_rounds")
            each = f" (rounds {' / '.join(fmt(v, '.2f') for v in rounds)})" if rounds else ""
            lines.append(f"  vs {x['peer']:<17} c={x['concurrency']:<3} tok/s x{fmt(x['tokens_per_s'], '.2f')}"
                         f"   TTFT p50 x{fmt(x['ttft_p50'], '.2f')}{each}")
    checks = target_checks(table, ratio_rows)
    if checks:
        lines += ["", "targets against llama-server (same run, same slots):"]
        lines += [f"  {'ok  ' if ok else 'FAIL'} {what}" for ok, what in checks]
    if any((r.get("cpu") or {}).get("other_cores", 0) > OTHER_LOAD_WARN for r in table):
        lines.append(f"\n! other processes used > {OTHER_LOAD_WARN} cores during a level marked '!': "
                     "its numbers are lower than on a quiet machine")
    for name, err in (failures or {}).items():
        lines.append(f"\n{name}: {err}")
    return "\n".join(lines)


# llamaray against llama-server: tokens/s at least these ratios, TTFT p50 at most, per concurrency.
TOKENS_RATIO = {1: 0.85, 16: 0.95}
TTFT_RATIO = {1: 1.3}
GAP_P99_MS = 250.0  # longest wait between two chunks of a generating stream (p99)


def target_checks(table: list[dict[str, Any]], ratio_rows: list[dict[str, Any]],
                  ours: str = "llamaray", peer: str = "llama-server") -> list[tuple[bool, str]]:
    """(met, description) for each target this run can check: a regression check, not a test."""
    out = []
    for x in ratio_rows:
        if x["peer"] != peer or x.get("ours", "llamaray") != ours:
            continue
        c = x["concurrency"]
        if c in TOKENS_RATIO and x["tokens_per_s"] is not None:
            out.append((x["tokens_per_s"] >= TOKENS_RATIO[c],
                        f"c={c} tok/s x{x['tokens_per_s']:.2f} of {peer} (>= {TOKENS_RATIO[c]})"))
        if c in TTFT_RATIO and x["ttft_p50"] is not None:
            out.append((x["ttft_p50"] <= TTFT_RATIO[c], f"c={c} TTFT p50 x{x['ttft_p50']:.2f} of {peer} "
                                                        f"(<= {TTFT_RATIO[c]})"))
    for r in table:
        if r["server"] != ours:
            continue
        out.append((r["failed_or_cut"] == 0, f"c={r['concurrency']} failed or cut streams: {r['failed_or_cut']} (0)"))
        if r.get("gap_p99_ms") is not None:
            out.append((r["gap_p99_ms"] <= GAP_P99_MS, f"c={r['concurrency']} inter-chunk p99 "
                                                       f"{r['gap_p99_ms']:.0f} ms (<= {GAP_P99_MS:.0f})"))
    return out


def write_chart(path: Path, table: list[dict[str, Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = list(dict.fromkeys(r["server"] for r in table))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    for name in servers:
        rs = sorted((r for r in table if r["server"] == name), key=lambda r: r["concurrency"])
        cs = [r["concurrency"] for r in rs]
        (l1,) = ax1.plot(cs, [r["tokens_per_s"] or 0 for r in rs], marker="o", label=name)
        ax2.plot(cs, [r["ttft_p50_ms"] or float("nan") for r in rs], marker="o", label=name,
                 color=l1.get_color())
        for r in rs:   # flag levels with failed or cut streams
            if r["failed_or_cut"]:
                for ax, y in ((ax1, r["tokens_per_s"] or 0), (ax2, r["ttft_p50_ms"])):
                    if y is not None:
                        ax.annotate(f"{r['failed_or_cut']}/{r['requests']} cut", (r["concurrency"], y),
                                    textcoords="offset points", xytext=(4, 6), fontsize=8,
                                    color=l1.get_color())
    all_cs = sorted({r["concurrency"] for r in table})
    for ax, ylabel in ((ax1, "completion tokens/s (all streams)"), (ax2, "TTFT p50 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_cs)
        ax.set_xticklabels([str(c) for c in all_cs])
        ax.set_xlabel("concurrent streams (closed loop)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend()
    ax1.set_ylim(bottom=0)
    ax2.set_yscale("log")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
