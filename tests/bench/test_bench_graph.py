"""The graph bench's pure parts (python -m bench.graph): CPU time per tier from /proc samples, the load
generator's window figures, the level record, the tables, the targets and the sizing lines. No Ray."""

from __future__ import annotations

import pytest

from bench.reports import graph_report as report
from bench.harness import procs
from bench.load.graph_load import window_figures
from bench.harness.procs import ProcSample
from bench.load.loadgen import RequestResult

APP = "llamaray"
TICK = procs.CLK_TCK


def stat_line(pid: int, comm: str, sid: int, utime: int, stime: int) -> str:
    # pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime ...
    return f"{pid} ({comm}) S 1 {sid} {sid} 0 -1 4194560 10 0 0 0 {utime} {stime} 0 0 20 0 8 0 100 0 0\n"


def test_stat_fields_are_counted_after_the_last_parenthesis():
    sid, cpu = procs.parse_stat(stat_line(42, "ray::Serve Replica:) x", 7, 3 * TICK, TICK))
    assert (sid, cpu) == (7, 4.0)


def test_a_process_is_sorted_into_its_tier_by_the_pid_it_reported_or_by_its_title():
    assert procs.tier_of("ray::ServeReplica:llamaray:Ingress.handle_request_with_rejection", APP) == "ingress"
    assert procs.tier_of("ray::ServeReplica:llamaray:ChatProcessor", APP) == "chat_processor"
    assert procs.tier_of("ray::ServeReplica:llamaray:LlamaModel-smollm2-135m.handle_request", APP) == "model"
    assert procs.tier_of("ray::ProxyActor.receive_asgi_messages", APP) == "proxy"
    assert procs.tier_of("ray::ServeController", APP) == "ray_other"
    assert procs.tier_of("/venv/bin/gcs_server --log_dir=x", APP) == "ray_other"
    assert procs.tier_of("ray::ServeReplica:other-app:Ingress", APP) == "ray_other"  # another application's
    assert procs.tier_of("ray::IDLE", APP, {9: "ingress"}, 9) == "ingress"   # what the replica said wins


def test_cpu_per_tier_is_the_difference_of_two_samples_and_a_new_process_counts_from_zero():
    before = {1: ProcSample(1, 5, "ray::ServeReplica:llamaray:Ingress", 10.0),
              2: ProcSample(2, 5, "ray::ProxyActor", 4.0),
              3: ProcSample(3, 5, "ray::ServeController", 1.0),
              4: ProcSample(4, 5, "ray::ServeReplica:llamaray:ChatProcessor", 2.0)}
    after = {1: ProcSample(1, 5, "ray::ServeReplica:llamaray:Ingress.handle_request", 12.5),
             2: ProcSample(2, 5, "ray::ProxyActor", 5.0),
             3: ProcSample(3, 5, "ray::ServeController", 1.25),
             4: ProcSample(4, 5, "ray::ServeReplica:llamaray:ChatProcessor", 3.0),
             7: ProcSample(7, 5, "/venv/bin/raylet --x", 0.5),               # started during the window
             8: ProcSample(8, 9, "python -m bench.load.graph_load --urls u", 0.75)}
    tiers, other = procs.cpu_by_tier(before, after, APP, {8: "loadgen"})
    assert tiers == {"ingress": 2.5, "chat_processor": 1.0, "proxy": 1.0, "model": 0.0, "ray_other": 0.75,
                     "loadgen": 0.75, "bench": 0.0}
    assert other == {"ray::ServeController": 0.25, "raylet": 0.5}


def test_a_reused_pid_is_a_new_process():
    before = {1: ProcSample(1, 5, "ray::ServeController", 30.0)}
    after = {1: ProcSample(1, 6, "ray::ServeController", 2.0)}
    assert procs.cpu_by_tier(before, after, APP)[0]["ray_other"] == 2.0


def test_sample_reads_a_session_and_named_pids(tmp_path):
    for pid, comm, sid, title in ((10, "raylet", 5, b"/bin/raylet\0--port\0"), (11, "bash", 6, b"bash\0"),
                                  (12, "python", 6, b"python\0-m\0bench.load.graph_load\0")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(stat_line(pid, comm, sid, TICK, 0))
        (tmp_path / str(pid) / "cmdline").write_bytes(title)
    (tmp_path / "self").mkdir()
    got = procs.sample(5, [12], proc=tmp_path)
    assert sorted(got) == [10, 12]
    assert got[10].title == "/bin/raylet --port" and got[10].cpu_s == 1.0
    assert procs.short_name(got[12].title) == "python bench.load.graph_load"


def test_machine_busy_counts_every_state_but_idle_and_iowait():
    line = f"cpu  {TICK} 0 {TICK} {100 * TICK} {50 * TICK} 0 {TICK} 0 0 0\ncpu0 1 2 3\n"
    assert procs.machine_busy_s(line) == 3.0


def test_listening_ports_of_a_process_from_its_socket_inodes(tmp_path):
    tcp = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
           "   0: 0100007F:2120 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1\n"
           "   1: 0100007F:2121 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 222 1\n"
           "   2: 0100007F:2120 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 333 1\n")
    assert procs.listening_inodes(tcp) == {111: 0x2120, 222: 0x2121}
    base = tmp_path / "40"
    (base / "net").mkdir(parents=True)
    (base / "net" / "tcp").write_text(tcp)
    (base / "fd").mkdir()
    for fd, inode in (("3", 111), ("4", 333)):
        (base / "fd" / fd).symlink_to(f"socket:[{inode}]")
    (base / "fd" / "5").symlink_to("/dev/null")
    assert procs.listening_ports(40, proc=tmp_path) == [0x2120]


def result(start: float, chunk_offsets: list[float], text: str, ttft: float | None = None,
           end: float = 0.0, usage: int | None = None) -> RequestResult:
    r = RequestResult(index=0, prompt_index=0, start=start, end=end, content_times=chunk_offsets, text=text,
                      ttft_s=ttft if ttft is not None else (chunk_offsets[0] if chunk_offsets else None))
    if usage is not None:
        r.completion_tokens, r.tokens_from_usage, r.got_done, r.finish_reason = usage, True, True, "length"
    return r


def test_window_figures_count_only_what_happened_in_the_window():
    done = result(0.0, [1.0, 9.0, 11.0, 12.0], "a b c d e f ", end=12.5, usage=6)        # ends in the window
    running = result(15.0, [0.5, 3.0, 10.0], "a b c d ")                                  # sent in it
    later = result(21.0, [], "")                                                           # no token yet
    at_t0 = {id(done): 2}
    at_t1 = {id(done): 6, id(running): 3, id(later): 0}
    fig = window_figures([done, running, later], 10.0, 20.0, at_t0, at_t1)
    assert fig["tokens"] == 4 + 3 and fig["tokens_per_s"] == pytest.approx(0.7)
    assert fig["chunks"] == 4   # 11, 12, 15.5, 18
    assert fig["gap_ms"]["n"] == 2 and fig["gap_ms"]["max"] == pytest.approx(2500.0)
    assert fig["ttft_ms"] == {"n": 1, "p50": 500.0, "p90": 500.0, "p99": 500.0, "max": 500.0}
    assert fig["ttft_missing"] == 0 and fig["requests_sent"] == 1
    assert fig["outcomes"] == {"ok": 1} and fig["token_count_mismatches"] == 0


def test_a_reply_whose_words_do_not_match_its_usage_is_reported():
    odd = result(0.0, [1.0], "one two", end=2.0, usage=5)
    assert window_figures([odd], 0.0, 10.0, {}, {id(odd): 1})["token_count_mismatches"] == 1


def load(tokens=33_000, chunks=3_300, window=10.0, ttft=(60.0, 90.0), gap=(150.0, 230.0), failed=0):
    return {"window_s": window, "tokens": tokens, "chunks": chunks, "tokens_per_s": tokens / window,
            "chunks_per_s": chunks / window, "ttft_ms": {"n": 50, "p50": ttft[0], "p90": None, "p99": ttft[1], "max": 1},
            "gap_ms": {"n": 3000, "p50": gap[0], "p90": None, "p99": gap[1], "max": 1}, "ttft_missing": 0,
            "requests_sent": 50, "requests_ended": 50, "outcomes": {"ok": 50, **({"http_error": failed} if failed else {})},
            "errors": [], "token_count_mismatches": 0}


def level(replicas=1, streams=64, **kw):
    cpu = {"ingress": 6.6, "chat_processor": 9.9, "proxy": 3.3, "model": 4.95, "ray_other": 1.65,
           "loadgen": 1.0, "bench": 0.1}
    return report.level_record(
        replicas=replicas, streams=streams, load=load(**kw), cpu_s=cpu, ray_other={"raylet": 1.0, "gcs_server": 0.65},
        machine_cpu_s=sum(cpu.values()) + 1.0, cpu_window_s=10.0,
        engine_before={"tokens_decoded": 1000, "steps": 100}, engine_after={"tokens_decoded": 35_000, "steps": 631},
        engine_window_s=10.0, step_s=0.019, prefill_s=0.002, coalescing_s=0.17)


def test_the_engine_sends_a_chunk_on_the_last_step_end_within_its_window():
    assert report.engine_gap_s(0.17, 0.019) == pytest.approx(0.152)
    assert report.engine_gap_s(0.025, 0.070) == pytest.approx(0.070)   # never less than one step
    assert report.engine_gap_s(0.1, 0.0) == 0.1


def test_a_level_record_puts_delivery_next_to_the_engine_and_cpu_per_delivered_tokens():
    lv = level()
    assert lv["delivered"]["tokens_per_s"] == 3300 and lv["engine"]["tokens_per_s"] == 3400
    assert lv["delivered_of_engine"] == pytest.approx(3300 / 3400)
    assert lv["engine"]["mean_step_ms"] == pytest.approx(10_000 / 531)
    assert lv["engine"]["nominal_tokens_per_s"] == pytest.approx(64 / 0.019)
    assert lv["engine_ttft_ms"] == pytest.approx(2.5 * 19 + 2)
    assert lv["ttft_added_ms"]["p50"] == pytest.approx(60 - 49.5)
    assert lv["gap_added_p99_ms"] == pytest.approx(230 - 152)
    assert lv["cpu_s_per_1k_tokens"]["chat_processor"] == pytest.approx(0.3)   # 9.9 s over 33,000 tokens
    assert lv["cores"]["ingress"] == pytest.approx(0.66)
    assert lv["other_cores"] == pytest.approx(0.1)
    assert report.serving_cpu_per_1k(lv) == pytest.approx((6.6 + 9.9 + 3.3 + 4.95 + 1.65) / 33)
    # 3,300 chunks of 10 tokens delivered; at the engine's pace a chunk holds 152 / 19 = 8 tokens
    assert lv["cpu_ms_per_chunk"]["chat_processor"] == pytest.approx(3.0)
    assert lv["nominal_tokens_per_chunk"] == pytest.approx(8.0)
    assert lv["cpu_s_per_1k_tokens_nominal"]["chat_processor"] == pytest.approx(3.0 / 8)
    assert report.serving_cpu_per_1k(lv, nominal=True) == pytest.approx(26.4 / 3.3 / 8)


def test_targets_are_checked_on_one_replica_at_64_streams_only():
    ok = level()
    slow = level(tokens=30_000, gap=(150.0, 260.0), failed=1)
    other = level(replicas=2, tokens=1)
    checks = report.target_checks([other, ok])
    assert [c[0] for c in checks] == [True, True, True, True]
    assert checks[0][1] == "R=1 streams=64: 3300 tok/s delivered (>= 95% of the H200's 3368)"
    checks = report.target_checks([slow])
    assert [c[0] for c in checks] == [False, False, False, False]
    assert "inter-chunk p99 260 ms, 108 ms over the engine's 152 ms (<= 100 added)" in checks[2][1]
    assert report.target_checks([level(streams=128)]) == []


def test_tables_show_every_level_and_flag_a_busy_machine():
    busy = level(streams=128)
    busy["other_cores"] = 0.5
    text = report.format_tables([level(), busy], {1: {"ingress": 0.02, "chat_processor": 0.01, "proxy": 0.03,
                                                       "model": 0.02, "ray_other": 0.05}})
    lines = text.splitlines()
    assert lines[1].split()[:5] == ["R", "streams", "tok/s", "engine", "tok/s"]
    row = next(line for line in lines if line.split()[:3] == ["1", "64", "3300"])
    assert row.split()[3:5] == ["3400", "0.971"]
    cpu_rows = [line for line in lines if line.split()[:2] in (["1", "64"], ["1", "128"]) and "0.300" in line]
    assert cpu_rows[0].split()[-4:-1] == ["0.800", "8.00", f"{26.4 / 3.3 / 8:.3f}"]   # serving, ms/chunk, at pace
    assert len(cpu_rows) == 2 and cpu_rows[1].endswith("!")
    assert "Ingress" in text and "ChatProc" in text and "other processes used" in text
    assert "idle, R=1: Ingress 0.020, ChatProc 0.010, proxy 0.030, model(Ray) 0.020, Ray other 0.050 cores " \
           "(serving 0.130)" in text


def test_sizing_gives_cores_per_1000_tokens_per_s_and_at_the_h200_rate():
    lines = report.sizing([level(replicas=2), level()])
    assert lines[0].startswith("sizing (from R=1 streams=64,")
    assert "8.0 tokens a chunk" in lines[0]
    chat = next(line for line in lines if "ChatProc" in line)
    assert "0.375 per 1,000 tok/s" in chat and f"{0.375 * 3.368:.2f} cores" in chat
    assert report.sizing([]) == []


def test_profile_records_every_replica_over_the_window_named_by_level_tier_and_pid(tmp_path, monkeypatch):
    from bench import graph

    ns = graph.parse_args(["--profile", "50", "--measure", "20", "--out", str(tmp_path)])
    assert graph.parse_args([]).profile == 0
    calls = []
    monkeypatch.setattr(graph.pyspy, "record",
                        lambda pid, s, base, rate: calls.append((pid, s, base.name, rate)) or [])
    samplers = graph.profile_tiers({11: "ingress", 12: "chat_processor", 13: "model"}, ns, "graph-r1", 64)
    assert sorted(calls) == [(11, 20.0, "graph-r1-s64-ingress-11", 50), (12, 20.0, "graph-r1-s64-chat_processor-12", 50),
                             (13, 20.0, "graph-r1-s64-model-13", 50)]
    assert sorted(p.name for p in samplers) == ["graph-r1-s64-chat_processor-12.txt", "graph-r1-s64-ingress-11.txt",
                                                "graph-r1-s64-model-13.txt"]
    assert (tmp_path / "profiles").is_dir()
    graph.print_profiles(samplers)  # no sampler ran, no stacks written: nothing to print, no error
