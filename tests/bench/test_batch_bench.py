"""python -m bench.batch's pure parts: the batch's lines are the closed loop's requests (prompt and seed), a finished
batch's output summarized (its tokens from each answer's usage; every custom_id once), the issue's two ratios and
their verdicts, and the table."""

from __future__ import annotations

from bench.batch import batch_lines, output_summary, parse_args, table, verdicts
from bench.load.loadgen import DEFAULT_PROMPTS, chat_payload


def test_the_batch_sends_what_the_closed_loop_sends():
    lines = batch_lines(40, "m", 16, 0.7, seed_base=100)
    assert [line["custom_id"] for line in lines] == [f"req-{i}" for i in range(40)]
    for i in (0, 33):
        streamed = chat_payload("m", DEFAULT_PROMPTS[i % len(DEFAULT_PROMPTS)], 16, temperature=0.7, seed=100 + i)
        body = lines[i]["body"]
        assert {k: v for k, v in streamed.items() if k not in ("stream", "stream_options")} == body
        assert lines[i]["url"] == "/v1/chat/completions" and lines[i]["method"] == "POST"


def answer(custom_id: str, tokens: int) -> dict:
    return {"custom_id": custom_id, "response": {"status_code": 200, "body": {"usage": {"completion_tokens": tokens}}},
            "error": None}


def test_a_finished_batch_is_summarized_from_its_output():
    summary = output_summary([answer("a", 10), answer("b", 30)], [{"custom_id": "c", "error": {"code": "x"}}], 4.0)
    assert summary == {"n_ok": 2, "n_failed": 1, "completion_tokens": 40, "wall_s": 4.0, "tokens_per_s": 10.0,
                       "each_once": True}
    assert not output_summary([answer("a", 1)], [{"custom_id": "a"}], 1.0)["each_once"]


def test_the_verdicts_hold_the_issues_targets():
    ok = verdicts(closed_loop_tps=100.0, batch_tps=95.0, ttft_alone_ms=100.0, ttft_beside_ms=115.0)
    assert ok["throughput_ok"] and ok["ttft_ok"] and abs(ok["ttft_beside_vs_alone"] - 1.15) < 1e-9
    bad = verdicts(100.0, 80.0, 100.0, 130.0)
    assert bad["throughput_ok"] is False and bad["ttft_ok"] is False
    missing = verdicts(None, 80.0, None, 130.0)
    assert missing["throughput_ok"] is None and missing["ttft_ok"] is None


def test_the_table_says_each_measurement_and_verdict():
    rows = {"closed loop at the slot count": {"n_requests": 20, "tokens_per_s": 300.0, "ttft_ms": {"p50": 40.0,
                                                                                                      "p90": 80.0},
                                              "n_failed": 0},
            "batch alone": {"n_ok": 20, "n_failed": 0, "tokens_per_s": 290.0}}
    lines = table(rows, verdicts(300.0, 290.0, None, None))
    assert lines[0].split()[0] == "measurement" and "batch alone" in lines[3]
    assert lines[-2].startswith("batch alone / closed loop tok/s: 0.97 (target >= 0.9: met)")
    assert lines[-1].endswith("(target <= 1.2: -)")


def test_the_defaults_are_the_issues_sizes():
    ns = parse_args([])
    assert ns.lines == 2000 and ns.interactive_concurrency == 4


def test_segments_share_the_lines_and_pool_by_wall_time():
    from bench.batch import pooled_batches, shares

    assert shares(2000, 4) == [500, 500, 500, 500]
    assert shares(10, 4) == [3, 3, 2, 2] and sum(shares(10, 4)) == 10
    assert shares(3, 8) == [1, 1, 1]  # never an empty segment
    pooled = pooled_batches([
        {"n_ok": 10, "n_failed": 0, "completion_tokens": 600, "wall_s": 4.0, "each_once": True},
        {"n_ok": 10, "n_failed": 1, "completion_tokens": 400, "wall_s": 6.0, "each_once": True}])
    assert pooled["tokens_per_s"] == 100.0 and pooled["n_failed"] == 1 and pooled["each_once"]
