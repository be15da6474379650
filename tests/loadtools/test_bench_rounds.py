"""`python -m bench --rounds N`: servers run forward, then backward, and each row pools its rounds."""

from __future__ import annotations

from bench import report
from bench.__main__ import parse_args, pool_rounds, run_order
from loadtools.loadgen import RequestResult, summarize


def level(server: str, c: int, round_: int, tokens: list[int], wall: float, ttft: float) -> dict:
    results = [RequestResult(index=i, prompt_index=i, start=0.0, end=1.0, ttft_s=ttft, completion_tokens=n,
                             tokens_from_usage=True, content_times=[ttft, ttft + 0.5])
               for i, n in enumerate(tokens)]
    return {"server": server, "concurrency": c, "round": round_, "summary": summarize(results, wall),
            "cpu": {"seconds": wall, "server_cores": 1.0 + round_, "loadgen_cores": 0.1, "other_cores": 0.0},
            "results": results}


def test_rounds_alternate_direction():
    assert run_order(["a", "b", "c"], 1) == [(0, "a"), (0, "b"), (0, "c")]
    assert run_order(["a", "b", "c"], 2) == [(0, "a"), (0, "b"), (0, "c"), (1, "c"), (1, "b"), (1, "a")]
    assert [n for _, n in run_order(["a", "b"], 3)] == ["a", "b", "b", "a", "a", "b"]
    assert parse_args([]).rounds == 1 and parse_args(["--rounds", "2"]).rounds == 2


def test_a_row_pools_its_rounds_over_their_summed_time():
    levels = [level("llamaray", 16, 0, [100, 100], 1.0, 0.2), level("llama-server", 16, 0, [150], 1.0, 0.1),
              level("llama-server", 16, 1, [150], 1.0, 0.1), level("llamaray", 16, 1, [100], 3.0, 0.4)]
    pooled = {p["server"]: p for p in pool_rounds(levels)}
    assert list(pooled) == ["llamaray", "llama-server"]
    ours = pooled["llamaray"]
    # 300 tokens over 4 s, not the mean of 200/s and 33/s
    assert ours["summary"]["tokens_per_s"] == 75.0 and ours["summary"]["n_requests"] == 3
    assert ours["tokens_per_s_rounds"] == [200.0, 33.3]
    assert ours["summary"]["ttft_ms"]["p50"] == 200.0
    assert ours["cpu"]["server_cores"] == 1.75  # weighted by each round's wall time: (1*1 + 2*3) / 4
    table = report.rows(pool_rounds(levels))
    text = report.format_table(table, report.ratios(table))
    assert "llamaray          c=16  200.0 / 33.3" in text and "x0.50" in text


def test_one_round_is_the_level_itself():
    lv = level("llamaray", 1, 0, [128, 128], 2.0, 0.1)
    [pooled] = pool_rounds([lv])
    assert pooled["summary"] == lv["summary"] and pooled["tokens_per_s_rounds"] == [128.0]
    text = report.format_table(report.rows([pooled]), [])
    assert "tok/s of each round" not in text
