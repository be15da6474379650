"""The benchmark's regression check: each issue-13 target is checked and a miss is marked FAIL."""

from __future__ import annotations

from bench import report


def row(server, c, tps, ttft, gap, failed=0):
    return {"server": server, "concurrency": c, "requests": 24, "tokens_per_s": tps, "ttft_p50_ms": ttft,
            "ttft_p95_ms": ttft, "itl_p50_ms": 10.0, "gap_p99_ms": gap, "failed_or_cut": failed,
            "outcomes": {"ok": 24 - failed, **({"cut": failed} if failed else {})}, "mean_completion_tokens": 128,
            "completion_tokens_source": "usage", "wall_s": 30.0, "cpu": None}


def test_targets_met_and_missed():
    table = [row("llamaray", 1, 90, 60, 120), row("llamaray", 16, 150, 500, 300, failed=1),
             row("llama-server", 1, 100, 50, 20), row("llama-server", 16, 160, 400, 40)]
    checks = dict((what, ok) for ok, what in report.target_checks(table, report.ratios(table)))
    assert checks == {
        "c=1 tok/s x0.90 of llama-server (>= 0.85)": True,
        "c=1 TTFT p50 x1.20 of llama-server (<= 1.3)": True,
        "c=16 tok/s x0.94 of llama-server (>= 0.95)": False,
        "c=1 failed or cut streams: 0 (0)": True,
        "c=1 inter-chunk p99 120 ms (<= 250)": True,
        "c=16 failed or cut streams: 1 (0)": False,
        "c=16 inter-chunk p99 300 ms (<= 250)": False,
    }
    text = report.format_table(table, report.ratios(table))
    assert "FAIL c=16 tok/s x0.94" in text and "ok   c=1 tok/s x0.90" in text and "gap p99 ms" in text
