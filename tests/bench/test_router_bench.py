"""bench/router.py's verdicts from made-up run summaries (no server)."""

from __future__ import annotations

from bench.router import format_table, goals


def run(ratio, p50, failed=0):
    return {"summary": {"n_requests": 48, "n_failed": failed, "cache_hit_ratio": ratio, "ttft_p50_ms": p50,
                        "ttft_p95_ms": p50 * 2, "ttft_mean_ms": p50 * 1.5,
                        "followup_ttft_p50_ms": p50}}


def test_goals_met():
    runs = {"load": run(0.7, 400.0), "prefix": run(0.9, 200.0)}
    assert goals(runs) == {"load": [], "prefix": []}
    table = format_table(runs, {})
    assert "| prefix | 48 | 0 | 0.900 | 200 | 400 | 300 | 200 | ok |" in table
    assert "TTFT p50 50% lower" in table


def test_each_missed_goal_says_fail():
    runs = {"load": run(0.7, 400.0), "prefix": run(0.75, 300.0)}
    notes = goals(runs)["prefix"]
    assert len(notes) == 2 and all(n.startswith("FAIL") for n in notes)
    assert "FAIL hit ratio" in format_table(runs, {}) and "FAIL TTFT p50 25%" in format_table(runs, {})
    assert goals({"prefix": run(0.95, 100.0, failed=1)})["prefix"] == ["FAIL hit ratio (goal >= 0.8)"]
