"""`python -m bench --rounds N`: the compared servers take turns level by level (the others run alone,
forward then backward), and each row pools its rounds."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from bench.reports import bench_report as report
from bench.__main__ import level_requests, parse_args, pool_rounds, run_order, turn_order, turn_requests
from bench.harness.procs import session_procs
from bench.harness.servers import Server
from bench.load.loadgen import RequestResult, summarize


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


def test_interleaved_servers_alternate_who_goes_first_per_level_and_round():
    assert turn_order(["a", "b"], [1, 16], 0) == [(1, 0, "a"), (1, 0, "b"), (16, 0, "b"), (16, 0, "a")]
    assert turn_order(["a", "b"], [1, 16], 1) == [(1, 0, "b"), (1, 0, "a"), (16, 0, "a"), (16, 0, "b")]
    # over an even number of rounds each server goes first at each level equally often
    order = [step for k in range(4) for step in turn_order(["a", "b"], [1, 4, 16], k)]
    for c in (1, 4, 16):
        firsts = [n for i, (cc, _, n) in enumerate(order) if cc == c and i % 2 == 0]
        assert sorted(firsts) == ["a", "a", "b", "b"]


def test_turns_run_a_level_to_its_end_before_the_next_alternating_who_goes_first():
    order = turn_order(["a", "b", "c"], [1, 16], 0, turns=2)
    assert order == [(1, 0, "a"), (1, 0, "b"), (1, 0, "c"), (1, 1, "c"), (1, 1, "b"), (1, 1, "a"),
                     (16, 0, "c"), (16, 0, "b"), (16, 0, "a"), (16, 1, "a"), (16, 1, "b"), (16, 1, "c")]
    assert turn_order(["a", "b"], [1], 1, turns=2) == [(1, 0, "b"), (1, 0, "a"), (1, 1, "a"), (1, 1, "b")]


def test_a_turn_sends_its_share_of_the_level_and_at_least_one_request_per_stream():
    assert turn_requests(1, None, 1) == 24 and turn_requests(1, None, 4) == 6 and turn_requests(1, None, 5) == 5
    assert turn_requests(16, None, 1) == 48 and turn_requests(16, None, 4) == 16
    ns = parse_args(["--turns", "4"])
    assert ns.turns == 4 and level_requests(ns, 1) == 24 and level_requests(ns, 16) == 64
    assert level_requests(parse_args(["--interleave", "", "--turns", "4"]), 1) == 24   # no turns when alone


def test_interleave_takes_the_listed_servers_in_the_servers_order():
    assert parse_args([]).interleave == ["llamaray", "llamaray-graph", "llama-server"]
    assert parse_args(["--servers", "llama-server,llamaray"]).interleave == ["llama-server", "llamaray"]
    assert parse_args(["--interleave", ""]).interleave == []
    # one server has nobody to take turns with: it runs alone
    assert parse_args(["--servers", "llamaray,llama-cpp-python"]).interleave == []


def test_per_round_ratios_are_printed_next_to_the_pooled_one():
    levels = [level("llamaray", 16, 0, [100], 1.0, 0.2), level("llama-server", 16, 0, [100], 1.0, 0.2),
              level("llama-server", 16, 1, [100], 1.0, 0.2), level("llamaray", 16, 1, [90], 1.0, 0.2)]
    table = report.rows(pool_rounds(levels))
    [ratio] = report.ratios(table)
    assert ratio["tokens_per_s"] == 0.95 and ratio["tokens_per_s_rounds"] == [1.0, 0.9]
    assert "tok/s x0.95   TTFT p50 x1.00 (rounds 1.00 / 0.90)" in report.format_table(table, [ratio])


class Sleeper(Server):
    name = "sleeper"

    def command(self) -> list[str]:   # a parent with a child: both in the session
        return [sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"]

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + 10
        while len(list(session_procs(self.session_id))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)


def _states(server: Server) -> list[str]:
    return sorted(rest[0] for _, rest in session_procs(server.session_id))


def test_pause_stops_every_process_of_the_session_and_resume_continues_them(tmp_path: Path):
    server = Sleeper(tmp_path)
    server.start()
    try:
        assert len(_states(server)) == 2 and "T" not in _states(server)
        server.pause()
        time.sleep(0.2)
        assert _states(server) == ["T", "T"]
        server.resume()
        time.sleep(0.2)
        assert "T" not in _states(server)
        server.pause()
    finally:
        server.stop()   # from paused: stop resumes it first, else SIGTERM would wait
    assert server.proc is not None and server.proc.poll() is not None
    assert [s for s in _states(server) if s != "Z"] == []   # a zombie waits for init to reap it


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


def test_the_turns_of_a_level_send_its_requests_once_each(monkeypatch):
    import asyncio

    import bench.__main__ as main
    sent: list[tuple[int, int]] = []

    async def fake_loop(url, model, c, n, prompts, *, first_index=0, **kw):
        sent.append((first_index, n))
        return [RequestResult(index=first_index + i, prompt_index=0, start=0.0, end=1.0, ttft_s=0.1,
                              completion_tokens=8, tokens_from_usage=True, content_times=[0.1, 0.5])
                for i in range(n)]

    class Meter:
        def __init__(self, sid): pass

        def read(self): return {"seconds": 1.0, "server_cores": 1.0, "loadgen_cores": 0.1, "other_cores": 0.0}

    monkeypatch.setattr(main, "run_closed_loop", fake_loop)
    monkeypatch.setattr(main, "wait_until_quiet", lambda sid, wait: {"other_cores": 0.0})
    monkeypatch.setattr(main, "CpuMeter", Meter)
    server = type("S", (), {"name": "a", "session_id": None, "base_url": "http://x", "model": "m"})()
    ns = parse_args(["--turns", "3"])
    levels = [asyncio.run(main.bench_level(server, ns, 1, 0, t)) for t in range(3)]
    measured = [(i, n) for i, n in sent if i != main.WARMUP_INDEX]
    assert measured == [(0, 8), (8, 8), (16, 8)]   # requests 0..23, as one turn of 24 would send
    assert [lv["turn"] for lv in levels] == [0, 1, 2]
