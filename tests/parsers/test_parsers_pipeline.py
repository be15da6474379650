from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.parsers import ReplyParser

CALL = '<tool_call>\n{{"name": "{}", "arguments": {{"q": "{}"}}}}\n</tool_call>'
QWEN3 = ("<think>\nNeed two lookups.\n</think>\n\nLooking up both.\n"
         + CALL.format("search", "a") + "\n" + CALL.format("search", "b"))


def stream(p, pieces):
    out = []
    for piece in pieces:
        out += p.feed(piece)
    return out + p.finish()


def test_parse_message_shape():
    got = ReplyParser("think", "hermes").parse(QWEN3)
    assert got["content"] == "Looking up both."
    assert got["reasoning_content"] == "Need two lookups."
    assert [c["function"] for c in got["tool_calls"]] == [
        {"name": "search", "arguments": '{"q": "a"}'}, {"name": "search", "arguments": '{"q": "b"}'}]
    assert all(set(c) == {"id", "type", "function"} and c["type"] == "function" for c in got["tool_calls"])


def test_content_none_only_with_tool_calls():
    assert ReplyParser("think", "hermes").parse("<think>x</think>" + CALL.format("f", "1"))["content"] is None
    assert ReplyParser("think", "hermes").parse("<think>x</think>")["content"] == ""
    assert ReplyParser().parse("") == {"content": "", "reasoning_content": None, "tool_calls": None}


def test_stream_one_feed_merges_and_shapes():
    p = ReplyParser("think", "hermes")
    out = p.feed(QWEN3)
    assert out[0] == {"reasoning_content": "Need two lookups."}
    assert out[1] == {"content": "Looking up both."}
    # Each call: a header delta (index, id, type, name, empty arguments), then its arguments.
    calls = [c for d in out[2:] for c in d["tool_calls"]]
    assert len(out) == 6 and [c["index"] for c in calls] == [0, 0, 1, 1]
    for head, args in (calls[0:2], calls[2:4]):
        assert re.fullmatch(r"call_[A-Za-z0-9]{24}", head["id"]) and head["type"] == "function"
        assert head["function"]["arguments"] == "" and set(args) == {"index", "function"}
    assert calls[0]["function"] == {"name": "search", "arguments": ""}
    assert calls[1]["function"] == {"arguments": '{"q": "a"}'}
    assert p.finish() == [] and p.made_tool_calls


def test_stream_char_by_char_never_sends_markers():
    deltas = stream(ReplyParser("think", "hermes"), list(QWEN3))
    texts = [v for d in deltas for k, v in d.items() if k != "tool_calls"]
    joined = "".join(texts)
    for frag in ("<", ">", "think", "tool_call"):
        assert frag not in joined
    # per call: a header, then its arguments in fragments as they came
    entries = [e for d in deltas for e in d.get("tool_calls", [])]
    for i, args in enumerate(['{"q": "a"}', '{"q": "b"}']):
        mine = [e for e in entries if e["index"] == i]
        assert mine[0]["function"] == {"name": "search", "arguments": ""} and len(mine) > 2
        assert "".join(e["function"]["arguments"] for e in mine[1:]) == args


def test_include_reasoning_false():
    p = ReplyParser("think", "hermes", include_reasoning=False)
    out = stream(p, [QWEN3[:20], QWEN3[20:]])
    assert not any("reasoning_content" in d for d in out)
    assert p.parse(QWEN3)["reasoning_content"] is None


def test_adjacent_content_merged_after_dropped_reasoning():
    p = ReplyParser("think", include_reasoning=False)
    assert p.feed("A<think>r</think>B") == [{"content": "A B"}]  # one delta; the sides kept apart


def test_parallel_tool_calls_false():
    p = ReplyParser("think", "hermes", parallel_tool_calls=False)
    got = p.parse(QWEN3)
    assert [c["function"]["arguments"] for c in got["tool_calls"]] == ['{"q": "a"}']
    out = stream(ReplyParser("think", "hermes", parallel_tool_calls=False), list(QWEN3))
    entries = [e for d in out for e in d.get("tool_calls", [])]
    assert {e["index"] for e in entries} == {0}  # only the first call, header and fragments
    assert "".join(e["function"]["arguments"] for e in entries) == '{"q": "a"}'


def test_made_tool_calls_false_without_calls():
    p = ReplyParser("think", "hermes")
    stream(p, ["<think>a</think>", "plain answer"])
    assert not p.made_tool_calls


def test_tool_parsing_only_on_content():
    text = "<think>" + CALL.format("f", "in reasoning") + "</think>ok"
    got = ReplyParser("think", "hermes").parse(text)
    assert got["tool_calls"] is None and got["content"] == "ok"
    assert "<tool_call>" in got["reasoning_content"]


def test_has_open_call_through_pipeline():
    p = ReplyParser("think", "hermes")
    assert p.has_open_call('<think>x</think><tool_call>{"name": "f", "arguments": {"a": ')
    assert not p.has_open_call('<think><tool_call>{"name": "f", "arguments": {"a": ')  # inside reasoning
    assert not p.has_open_call(QWEN3)
    assert not ReplyParser("think").has_open_call('<tool_call>{"name":')


def test_unclosed_reasoning_reaches_content_and_tool_parser():
    got = ReplyParser("think", "hermes", starts_in_reasoning=True).parse("just thinking")
    assert got == {"content": "just thinking", "reasoning_content": "just thinking", "tool_calls": None}


def test_unknown_parser_names():
    with pytest.raises(ValueError):
        ReplyParser("deepseek")
    with pytest.raises(ValueError):
        ReplyParser(tools="xml")


TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", CALL.format("f", "x"), "<thi", "<tool",
          '{"name": "g", "arguments": {}}', "{", "}", " ", "\n", "ok", "<"]


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.sampled_from(TOKENS), max_size=12), sir=st.booleans(), inc=st.booleans(),
       par=st.booleans(), data=st.data())
def test_pipeline_split_invariant(parts, sir, inc, par, data):
    text = "".join(parts)
    make = lambda: ReplyParser("think", "hermes", starts_in_reasoning=sir, include_reasoning=inc,
                               parallel_tool_calls=par)
    want = make().parse(text)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    p = make()
    acc = {"content": "", "reasoning_content": ""}
    calls = {}
    for d in stream(p, [text[a:b] for a, b in zip(bounds, bounds[1:])]):
        (k, v), = d.items()
        if k == "tool_calls":
            for e in v:
                calls.setdefault(e["index"], [e["function"].get("name"), ""])[1] += e["function"]["arguments"]
        else:
            acc[k] += v
            assert (want[k] or "").startswith(acc[k])
    assert acc["content"] == (want["content"] or "")
    assert acc["reasoning_content"] == (want["reasoning_content"] or "")
    assert [calls[i] for i in sorted(calls)] == [
        [c["function"]["name"], c["function"]["arguments"]] for c in want["tool_calls"] or []]
    assert p.made_tool_calls == bool(want["tool_calls"])
