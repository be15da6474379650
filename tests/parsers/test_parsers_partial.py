from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from app.parsers.partial import EdgeTrim, JsonEndScanner, find_first, find_json_end, partial_prefix_len


def test_partial_prefix_len():
    tags = ("<think>", "</think>")
    assert partial_prefix_len("hello", tags) == 0
    assert partial_prefix_len("hello <", tags) == 1
    assert partial_prefix_len("hello </thi", tags) == 5
    assert partial_prefix_len("hello <think", tags) == 6
    assert partial_prefix_len("hello <think>", tags) == 0  # a whole tag is not a *proper* prefix
    assert partial_prefix_len("a <b", tags) == 0
    assert partial_prefix_len("", tags) == 0
    assert partial_prefix_len("x[TOOL_CALL", ("[TOOL_CALLS]",)) == 10


def test_find_first():
    assert find_first("a </think> <think>", ("<think>", "</think>")) == (2, "</think>")
    assert find_first("a <think>", ("<think>", "</think>")) == (2, "<think>")
    assert find_first("nothing", ("<think>",)) == (-1, None)


def test_find_json_end_strings_and_escapes():
    t = '{"a": "}{", "b": "\\"}", "c": [1, {"d": "]"}]} tail'
    assert t[:find_json_end(t)] == '{"a": "}{", "b": "\\"}", "c": [1, {"d": "]"}]}'
    assert find_json_end('{"a": "x') == -1
    assert find_json_end('{"a": [1, 2]') == -1
    assert find_json_end("x{}") == -1
    assert find_json_end("x{}", 1) == 3
    assert find_json_end("[f(a=']')] rest", python=True) == 10
    assert find_json_end("[f(a=']')] rest") == 7  # JSON mode: ' is not a quote


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(), kids, max_size=3),
    max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(obj=st.dictionaries(st.text(), json_values, max_size=4), tail=st.text(), data=st.data())
def test_scanner_incremental_equals_whole(obj, tail, data):
    text = json.dumps(obj, ensure_ascii=data.draw(st.booleans())) + tail
    whole = find_json_end(text)
    assert whole == len(text) - len(tail)
    scanner = JsonEndScanner(0)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=8)))
    results = [scanner.end(text[:c]) for c in cuts] + [scanner.end(text)]
    assert results[-1] == whole
    assert all(r in (-1, whole) for r in results)
    # never claims closure before the value is complete
    for c, r in zip(cuts, results):
        assert (r == whole) == (c >= whole)


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=" \n\tab"), cuts=st.sets(st.integers(0, 30), max_size=6))
def test_edge_trim_split_invariant(text, cuts):
    def run(pieces, strip):
        t = EdgeTrim(strip_leading=strip)
        return "".join(t.push(p) for p in pieces), t.pending
    bounds = [0, *sorted(c for c in cuts if c < len(text)), len(text)]
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    for strip in (False, True):
        assert run(pieces, strip) == run([text], strip)
        out, held = run([text], strip)
        assert out + held == (text.lstrip() if strip else text)
        assert held.strip() == "" and out == out.rstrip()


def test_edge_trim_cut_drops_whitespace_on_both_sides():
    t = EdgeTrim()
    assert t.push("Sure.\n") == "Sure."
    t.cut()
    assert t.push("\n  ") == ""
    assert t.push(" Done ") == "Done"
    assert t.flush() == " "
