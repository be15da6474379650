"""bench.hops's arithmetic on made-up traces: which spans make which phase, in both shapes. (The bench itself
runs real servers; tests/graph/test_tracing.py checks that the real servers export these spans.)"""

from __future__ import annotations

import pytest

from bench.hops import PHASES, format_table, medians, phases, tracing_overlay
from bench.harness.otlp_collector import CLIENT, SERVER, ReceivedSpan

MS = 1_000_000


def span(name: str, start_ms: float, end_ms: float, kind: int = 1, events: dict[str, float] | None = None):
    events = events or {}
    return ReceivedSpan(name=name, trace_id="t", span_id=name, parent_id="", kind=kind, start_ns=int(start_ms * MS),
                        end_ns=int(end_ms * MS), attributes={}, resource={}, events=tuple(events),
                        error=False, event_ns=tuple(int(v * MS) for v in events.values()))


def single_trace() -> list[ReceivedSpan]:
    return [span("POST /v1/chat/completions", 1, 200, SERVER), span("chat m", 1.5, 190), span("plan", 1.6, 2.1),
            span("generate m", 2.5, 180, events={"first_token": 90}), span("queue", 3, 3.5),
            span("prefill", 3.5, 89), span("decode", 89, 180)]


def graph_trace() -> list[ReceivedSpan]:
    return [span("POST /v1/chat/completions", 1, 200, SERVER), span("ChatProcessor/stream", 1.3, 199, CLIENT),
            span("chat m", 3.5, 190), span("plan", 3.6, 4.1), span("LlamaModel-m/generate", 4.3, 185, CLIENT),
            span("generate m", 6.5, 180, events={"first_token": 94}), span("queue", 7, 7.5),
            span("prefill", 7.5, 93), span("decode", 93, 180)]


def test_a_graph_request_phases_name_each_hop():
    got = phases(graph_trace(), sent_ns=0, first_ns=96 * MS)
    assert got == pytest.approx({"ttft": 96, "http_in": 1, "to_processor": 2.5, "hop_processor": 2.2, "plan": 0.5,
                                 "to_model": 3, "hop_model": 2.2, "to_queue": 0.5, "queue": 0.5, "prefill": 86.5,
                                 "back": 2})


def test_make_runs_shape_has_no_hops():
    got = phases(single_trace(), sent_ns=0, first_ns=90.5 * MS)
    assert got["hop_processor"] is None and got["hop_model"] is None
    assert got["to_processor"] == pytest.approx(0.5) and got["to_model"] == pytest.approx(1)
    assert got["prefill"] == pytest.approx(86.5) and got["back"] == pytest.approx(0.5)


def test_a_trace_without_the_first_token_is_refused():
    spans = [s if not s.name.startswith("generate") else span("generate m", 2.5, 180) for s in single_trace()]
    with pytest.raises(ValueError):
        phases(spans, sent_ns=0, first_ns=90 * MS)


def test_medians_skip_what_a_shape_lacks_and_the_table_shows_a_dash():
    rows = [phases(single_trace(), 0, 90.5 * MS), phases(single_trace(), 0, 92.5 * MS)]
    got = medians(rows)
    assert set(got) == set(PHASES) and got["ttft"] == 91.5 and got["hop_model"] is None
    table = format_table({"llamaray": {"requests": 2, **got}}, {"calls": 100, "entered_ms": 1.9, "first_item_ms": 2.3})
    lines = table.splitlines()
    assert lines[0].startswith("| server | requests | ttft |") and "| llamaray | 2 | 91.5 |" in lines[2]
    assert " - |" in lines[2] and "1.90 ms after `.remote()`" in table


def test_the_tracing_overlay_names_the_collector(tmp_path):
    import yaml
    path = tracing_overlay("http://127.0.0.1:4318", tmp_path / "o.yaml")
    app = yaml.safe_load(path.read_text())["applications"][0]
    assert app["name"] == "llamaray" and app["args"]["tracing"]["endpoint"] == "http://127.0.0.1:4318"
