"""Recorded model replies (tests/data/replies): exact non-streaming results,
and streaming == non-streaming for any split of the text into pieces: the content,
the reasoning, and each call's name and concatenated argument fragments."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.parsers import ReplyParser

DATA = Path(__file__).resolve().parents[1] / "data" / "replies"
CALL_ID = re.compile(r"call_[A-Za-z0-9]{24}")

# fragments (marker minus its last char) that must never show up in a field
TOOL_MARKERS = {
    "hermes": ["<tool_call>", "</tool_call>"],
    "llama3_json": ["<|python_tag|>"],
    "mistral": ["[TOOL_CALLS]"],
    "pythonic": [],
}


def load_cases():
    cases = []
    for meta_path in sorted(DATA.glob("*/*.json")):
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        text = meta_path.with_suffix(".txt").read_bytes().decode("utf-8")
        cases.append(pytest.param(meta, text, id=f"{meta_path.parent.name}/{meta_path.stem}"))
    return cases


CASES = load_cases()


def make_parser(meta, **overrides) -> ReplyParser:
    kwargs = dict(starts_in_reasoning=meta["starts_in_reasoning"])
    if "think_tags" in meta:
        kwargs["think_tags"] = tuple(meta["think_tags"])
    kwargs.update(overrides)
    return ReplyParser(meta["reasoning"], meta["tools"], **kwargs)


def stream(parser: ReplyParser, pieces) -> list[dict]:
    deltas = []
    for piece in pieces:
        deltas += parser.feed(piece)
    deltas += parser.finish()
    return deltas


def accumulate(deltas: list[dict], expected: dict) -> dict:
    """Accumulate deltas the way the OpenAI SDK does, checking along the way
    that every delta is prefix-consistent with the expected final message."""
    acc = {"content": "", "reasoning_content": "", "tool_calls": {}, "fragments": {}}
    want_calls = expected["tool_calls"] or []
    for d in deltas:
        assert len(d) == 1, d
        (key, value), = d.items()
        if key in ("content", "reasoning_content"):
            assert isinstance(value, str) and value, d
            acc[key] += value
            assert (expected[key] or "").startswith(acc[key]), (key, acc[key])
            continue
        assert key == "tool_calls", d
        for e in value:
            calls, idx, fn = acc["tool_calls"], e["index"], e["function"]
            if idx not in calls:
                assert idx == len(calls), "calls appear in index order"
                assert set(e) == {"index", "id", "type", "function"}, e
                assert e["type"] == "function" and CALL_ID.fullmatch(e["id"]), e
                assert isinstance(fn["name"], str) and fn["name"]
                assert fn["arguments"] == "", "the header carries no arguments"
                calls[idx] = {"id": e["id"], "name": fn["name"], "arguments": ""}
                acc["fragments"][idx] = 0
            else:  # later deltas: only index + an arguments fragment (no name/id to re-concatenate)
                assert set(e) == {"index", "function"} and set(fn) == {"arguments"}, e
                assert fn["arguments"], "no empty fragments"
                calls[idx]["arguments"] += fn["arguments"]
                acc["fragments"][idx] += 1
            assert idx < len(want_calls)
            assert want_calls[idx]["function"]["arguments"].startswith(calls[idx]["arguments"])
    return acc


def assert_stream_matches(parser: ReplyParser, expected: dict, pieces) -> dict:
    """Streamed == ``expected`` (from ``parse``); returns the accumulated stream."""
    deltas = stream(parser, pieces)
    acc = accumulate(deltas, expected)
    calls = [acc["tool_calls"][i] for i in sorted(acc["tool_calls"])]
    assert acc["content"] == (expected["content"] or "")
    assert acc["reasoning_content"] == (expected["reasoning_content"] or "")
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in (expected["tool_calls"] or [])]
    assert parser.made_tool_calls == bool(calls)
    return acc


@pytest.mark.parametrize("meta,text", CASES)
def test_parse_matches_recording(meta, text):
    got = make_parser(meta).parse(text)
    exp = meta["expected"]
    assert got["content"] == exp["content"]
    assert got["reasoning_content"] == exp["reasoning_content"]
    if exp["tool_calls"] is None:
        assert got["tool_calls"] is None
    else:
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in got["tool_calls"]] == [
            (c["name"], c["arguments"]) for c in exp["tool_calls"]]
        for c in got["tool_calls"]:
            assert c["type"] == "function" and CALL_ID.fullmatch(c["id"])
            if not meta.get("invalid_arguments"):  # a cut or broken call keeps what was generated
                assert isinstance(json.loads(c["function"]["arguments"]), dict)


def _markers(meta):
    think = list(meta.get("think_tags", ["<think>", "</think>"])) if meta["reasoning"] == "think" else []
    return think, TOOL_MARKERS.get(meta["tools"], [])


def _claimed(case):
    """Replies whose calls are not claimed keep their raw text (markers included) as content."""
    meta = case.values[0]
    think, tool = _markers(meta)
    return not any(m in (meta["expected"]["content"] or "") for m in tool + think)


WELL_FORMED = [c for c in CASES if _claimed(c)]


def test_well_formed_cases_are_most_cases():
    assert len(WELL_FORMED) >= len(CASES) - 6


@pytest.mark.parametrize("meta,text", WELL_FORMED)
def test_no_marker_fragments_in_fields(meta, text):
    """Well-formed replies: no field holds a marker or a marker fragment."""
    exp = meta["expected"]
    think, tool = _markers(meta)
    fields = [(exp["content"] or "", think + tool), (exp["reasoning_content"] or "", think)]
    for value, markers in fields:
        for m in markers:
            assert m[:-1] not in value, (m, value)


@pytest.mark.parametrize("meta,text", CASES)
def test_stream_one_char_pieces(meta, text):
    expected = make_parser(meta).parse(text)
    acc = assert_stream_matches(make_parser(meta), expected, list(text))
    # JSON formats stream the arguments as they are generated: fed one char at a time, a call's
    # arguments arrive in several fragments (pythonic calls, and calls written arguments-first, are
    # held until they close: one fragment).
    streams = meta["tools"] != "pythonic" and not meta.get("arguments_held")
    for i in range(len(expected["tool_calls"] or [])):
        assert acc["fragments"][i] > 1 if streams else acc["fragments"][i] == 1, (i, acc["fragments"][i])


@pytest.mark.parametrize("meta,text", CASES)
def test_stream_every_two_way_split(meta, text):
    """Cut the text once at every position: every marker is cut at every point."""
    expected = make_parser(meta).parse(text)
    for i in range(len(text) + 1):
        assert_stream_matches(make_parser(meta), expected, [text[:i], text[i:]])


@pytest.mark.parametrize("meta,text", CASES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_stream_random_pieces(meta, text, data):
    sizes = data.draw(st.lists(st.integers(1, 12), min_size=1, max_size=40), label="sizes")
    pieces, pos, k = [], 0, 0
    while pos < len(text):
        pieces.append(text[pos:pos + sizes[k % len(sizes)]])
        pos += sizes[k % len(sizes)]
        k += 1
    empty_at = data.draw(st.sets(st.integers(0, len(pieces))), label="empty pieces")
    for i in sorted(empty_at, reverse=True):
        pieces.insert(i, "")
    expected = make_parser(meta).parse(text)
    assert_stream_matches(make_parser(meta), expected, pieces)


@pytest.mark.parametrize("meta,text", CASES)
def test_without_reasoning_and_single_call(meta, text):
    full = make_parser(meta).parse(text)
    p = make_parser(meta, include_reasoning=False, parallel_tool_calls=False)
    got = p.parse(text)
    assert got["reasoning_content"] is None
    assert got["content"] == full["content"]
    assert [c["function"] for c in got["tool_calls"] or []] == \
        [c["function"] for c in full["tool_calls"] or []][:1]
    assert_stream_matches(make_parser(meta, include_reasoning=False, parallel_tool_calls=False),
                          got, [text[i:i + 3] for i in range(0, len(text), 3)])
