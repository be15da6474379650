"""The benchmark's regression check: each target (tok/s and TTFT against llama-server, failed streams,
inter-chunk p99) is checked and a miss is marked FAIL."""

from __future__ import annotations

from bench.reports import bench_report as report


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


def test_the_graph_shape_is_compared_with_the_peers_in_a_block_of_its_own_and_has_no_targets():
    table = [row("llamaray", 16, 150, 400, 120), row("llamaray-graph", 16, 120, 500, 200),
             row("llama-server", 16, 160, 400, 40)]
    ratio_rows = report.ratios(table) + report.ratios(table, ours="llamaray-graph", skip=("llamaray",))
    pairs = [(x["ours"], x["peer"]) for x in ratio_rows]
    assert pairs == [("llamaray", "llamaray-graph"), ("llamaray", "llama-server"), ("llamaray-graph", "llama-server")]
    assert ratio_rows[2]["tokens_per_s"] == 0.75
    text = report.format_table(table, ratio_rows)
    graph_block = text.split("llamaray-graph / peer")[1]
    assert "vs llama-server      c=16  tok/s x0.75" in graph_block
    checks = [what for _, what in report.target_checks(table, ratio_rows)]
    assert "c=16 tok/s x0.94 of llama-server (>= 0.95)" in checks       # llamaray's, not the graph's 0.75
    assert not any("x0.75" in what for what in checks)
