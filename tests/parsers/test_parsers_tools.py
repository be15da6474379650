from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.parsers import (
    TOOL_PARSERS, CallDelta, Delta, HermesToolParser, Llama3JsonToolParser, MistralToolParser,
    PythonicToolParser, ToolCall, detect_tool_parser, get_tool_parser,
)
from app.parsers.partial import find_json_end
from app.parsers.tools import parse_pythonic


def calls(parser, text):
    content, got = parser.parse(text)
    return content, [(c.name, json.loads(c.arguments)) for c in got]


def run(parser, pieces):
    out = []
    for p in pieces:
        out += parser.feed(p)
    return out + parser.finish()


def test_registry_and_detect():
    assert set(TOOL_PARSERS) == {"hermes", "llama3_json", "mistral", "pythonic"}
    assert get_tool_parser("mistral") is MistralToolParser
    with pytest.raises(ValueError, match="unknown tool parser"):
        get_tool_parser("xml")
    assert detect_tool_parser("{{- '<tool_call>\\n' }}") == "hermes"
    assert detect_tool_parser("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert detect_tool_parser("{{ '<|python_tag|>' }}") == "llama3_json"
    assert detect_tool_parser("{%- if message.role == 'ipython' %}") == "llama3_json"
    assert detect_tool_parser("{{ message.content }}") is None
    assert detect_tool_parser(None) is None


# ------------------------------------------------------------------ hermes
def test_hermes_prose_and_two_calls():
    text = ('Checking both.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>\nDone.')
    assert calls(HermesToolParser(), text) == ("Checking both. Done.", [("a", {"x": 1}), ("b", {})])


def test_hermes_arguments_raw_and_string_args():
    # the raw text the model wrote, not a re-serialisation: what streaming sends is what parse returns
    content, got = HermesToolParser().parse('<tool_call>{"name":"f","arguments":{"k":"é","n":[1,2]}}</tool_call>')
    assert content == "" and got[0].arguments == '{"k":"é","n":[1,2]}'
    _, got = HermesToolParser().parse('<tool_call>{"name": "f", "arguments": " {\\"a\\":1} "}</tool_call>')
    assert got[0].arguments == '{"a":1}'  # arguments as a JSON string: that string, stripped
    _, got = HermesToolParser().parse('<tool_call>{"name": "f", "arguments": {"a": 1}, "arguments": {"b": 2}}'
                                      '</tool_call>')
    assert got[0].arguments == '{"a": 1}'  # streamed as it came: the first arguments object stands
    _, got = HermesToolParser().parse('<tool_call>{"arguments": {"a": 1}, "arguments": {"b": 2}, "name": "f"}'
                                      '</tool_call>')
    assert got[0].arguments == '{"b": 2}'  # held to the end (name last): read as json.loads does
    _, got = HermesToolParser().parse('<tool_call>{"name": "f"}</tool_call>')
    assert got[0].arguments == "{}"


def test_hermes_list_in_one_block():
    text = '<tool_call>[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"y": 2}}]</tool_call>'
    assert calls(HermesToolParser(), text) == ("", [("a", {}), ("b", {"y": 2})])


@pytest.mark.parametrize("bad", [
    '<tool_call>\n{"name": 3, "arguments": {"x": 1}}\n</tool_call>',     # name not a string
    '<tool_call>\n{"arguments": {"x": 1}}\n</tool_call>',                # no name
    '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',        # arguments not an object
    '<tool_call>\nnot json\n</tool_call>',
])
def test_hermes_invalid_block_is_content(bad):
    assert HermesToolParser().parse("Hi " + bad + " bye") == ("Hi " + bad + " bye", [])


def test_hermes_truncated_call_is_open():
    text = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    p = HermesToolParser()
    content, got = p.parse(text)  # the call went out while it streamed: it keeps what was generated
    assert content == "Sure." and [(c.name, c.arguments) for c in got] == [("get_weather", '{"city": "Par')]
    before = 'Sure.\n<tool_call>\n{"name": "get_weather", "argu'  # no arguments yet: nothing was sent
    assert p.parse(before) == (before, [])
    assert p.has_open_call(text) and p.has_open_call(before)
    assert p.has_open_call("Sure.<tool_call>\n")
    assert not p.has_open_call(text + 'is"}}\n</tool_call>')
    assert not p.has_open_call(text + 'is"}}')  # JSON closed, closing tag missing: complete
    assert not p.has_open_call("Sure.")
    assert not p.has_open_call("Sure. <tool_ca")


def test_hermes_streaming_shape():
    p = HermesToolParser()
    assert p.feed("Let me check.\n<tool") == [Delta("content", "Let me check.")]
    assert p.feed('_call>\n{"name": "get_weather", ') == []  # the name alone is not enough
    assert p.feed('"argum') == []
    # OpenAI's streaming shape: a header with id and name once the arguments open, then fragments.
    head, first = p.feed('ents": {"ci')
    assert isinstance(head, CallDelta) and (head.index, head.name, head.arguments) == (0, "get_weather", "")
    assert head.id.startswith("call_") and len(head.id) == 29
    assert (first.index, first.id, first.name, first.arguments) == (0, None, None, '{"ci')
    assert p.feed('ty": "Par') == [CallDelta(0, 'ty": "Par')]
    assert p.feed('is"}}\n</tool_') == [CallDelta(0, 'is"}')]  # never past the arguments' brace
    assert p.feed("call>\n") == []
    assert p.finish() == []


def test_hermes_never_streams_into_the_closing_tag():
    p = HermesToolParser()
    out = p.feed('<tool_call>{"name": "f", "arguments": {"a": "x</tool_')
    assert [d.arguments for d in out] == ["", '{"a": "x']  # "</tool_" may be the closing tag: held
    assert [d.arguments for d in p.feed("call>")] == []
    assert p.finish() == []  # the region ended at the tag: the call keeps '{"a": "x'


def test_calls_to_unknown_names_are_never_sent():
    allowed = frozenset({"get_weather"})
    text = '<tool_call>{"name": "rm_rf", "arguments": {"path": "/"}}</tool_call>'
    for parser in (HermesToolParser(allowed), MistralToolParser(allowed)):
        src = text if isinstance(parser, HermesToolParser) else '[TOOL_CALLS]rm_rf[ARGS]{"path": "/"}'
        assert [d for piece in src for d in parser.feed(piece)] + parser.finish() == [Delta("content", src)]
    # a list: the allowed call before it streams, the unknown one is never sent (nor as content)
    p = MistralToolParser(allowed)
    src = ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}, '
           '{"name": "rm_rf", "arguments": {"path": "/"}}]')
    content, got = p.parse(src)
    assert content == "" and [(c.name, c.arguments) for c in got] == [("get_weather", '{"city": "Oslo"}')]


def test_a_sent_call_whose_json_breaks_keeps_its_arguments():
    """Once a header went out the client has the call: the arguments are what the model wrote up to
    where the arguments object closed or the region ended; parse agrees; the region's other text is
    dropped, never sent."""
    cases = {
        HermesToolParser: ('<tool_call>\n{"name": "f", "arguments": {"x": 1}\n</tool_call> ok', "ok", '{"x": 1}'),
        Llama3JsonToolParser: ('{"name": "f", "parameters": {"a": 1}', "", '{"a": 1}'),
        MistralToolParser: ('[TOOL_CALLS]f[ARGS]{"a": ', "", '{"a": '),
    }
    for cls, (text, content, args) in cases.items():
        got_content, got = cls().parse(text)
        assert (got_content, [(c.name, c.arguments) for c in got]) == (content, [("f", args)]), cls
        streamed = run(cls(), list(text))
        assert "".join(d.arguments for d in streamed if isinstance(d, CallDelta)) == args


def test_hermes_unclosed_tag_at_finish_accepted():
    assert calls(HermesToolParser(), '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n') == ("", [("f", {"a": 1})])


# ------------------------------------------------------------------ llama3_json
def test_llama3_call_forms():
    p = Llama3JsonToolParser()
    assert calls(p, '<|python_tag|>{"name": "f", "parameters": {"a": 1}}') == ("", [("f", {"a": 1})])
    assert calls(p, ' {"name": "f", "arguments": {"a": 1}} ; {"name": "g", "parameters": {}}') == (
        "", [("f", {"a": 1}), ("g", {})])


@pytest.mark.parametrize("prose", [
    '{"temperature": 21, "unit": "C"}',
    '{"name": "Ada", "born": 1815}',
    '[{"name": "f", "parameters": {}}]',
    'Call it as {"name": "f", "parameters": {}}',
    '{"name": "f", "parameters": [1]}',  # parameters not an object
    '{not json at all}',
    '<|python_tag|>',
    '<|python_tag|>print(1)',
])
def test_llama3_json_looking_prose_is_content(prose):
    assert Llama3JsonToolParser().parse(prose) == (prose, [])


def test_llama3_after_call_text_and_bad_second_call():
    text = '{"name": "f", "parameters": {}}; {"city": "Paris"}'
    assert calls(Llama3JsonToolParser(), text) == ('; {"city": "Paris"}', [("f", {})])


def test_llama3_has_open_call():
    p = Llama3JsonToolParser()
    assert p.has_open_call('<|python_tag|>{"name": "f", "parameters": {"a": ')
    assert p.has_open_call('{"name": "f", "parameters": {}}; {"name": "g"')
    assert not p.has_open_call('{"name": "f", "parameters": {}}')
    assert not p.has_open_call('The answer {"a": ')


# ------------------------------------------------------------------ mistral
def test_mistral_forms():
    p = MistralToolParser()
    assert calls(p, '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]') == (
        "", [("f", {"a": 1}), ("g", {})])
    assert calls(p, '[TOOL_CALLS] {"name": "f", "arguments": {"a": 1}}') == ("", [("f", {"a": 1})])
    assert calls(p, 'Ok.[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g[ARGS]{}') == ("Ok.", [("f", {"a": 1}), ("g", {})])


@pytest.mark.parametrize("bad", [
    '[TOOL_CALLS]',
    '[TOOL_CALLS] hello',
    '[TOOL_CALLS]f[ARGS][1]',
    '[TOOL_CALLS]f(a=1)',
    '[TOOL_CALLS]f[ARGS]',
    '[TOOL_CALLS][{"name": "f"}, 3]',
])
def test_mistral_invalid_is_content(bad):
    assert MistralToolParser().parse(bad) == (bad, [])


def test_mistral_has_open_call():
    p = MistralToolParser()
    assert p.has_open_call('[TOOL_CALLS][{"name": "f", "arguments": {"a": "x')
    assert p.has_open_call('[TOOL_CALLS]get_wea')
    assert p.has_open_call('[TOOL_CALLS]f[ARGS]{"a": [1')
    assert not p.has_open_call('[TOOL_CALLS]f[ARGS]{"a": [1]}')
    assert not p.has_open_call('no call [TOOL_')


# ------------------------------------------------------------------ pythonic
def test_pythonic_literals():
    assert parse_pythonic("[f(a=1, b='x', c=[1, (2, 3)], d={'k': None}, e=True, g=-1.5)]") == [
        ("f", '{"a": 1, "b": "x", "c": [1, [2, 3]], "d": {"k": null}, "e": true, "g": -1.5}')]
    assert parse_pythonic("[a.b.c()]") == [("a.b.c", "{}")]


@pytest.mark.parametrize("bad", [
    "[f(1)]",                        # positional
    "[f(**kw)]",
    "[f(a=g())]",                    # call in a value: never evaluated
    "[f(a=__import__('os'))]",
    "[f(a={1, 2})]",                 # a set is not JSON
    "[f(a=b'x')]",
    "[]",
    "[f(a=1)",                       # unclosed
    "[f(a=1), 3]",
])
def test_pythonic_rejects(bad):
    assert PythonicToolParser().parse(bad) == (bad, [])


def test_pythonic_streaming_and_open():
    p = PythonicToolParser()
    assert p.feed("[get_wea") == []
    assert p.feed("ther(city='Par") == []
    out = p.feed("is')]\nDone")
    assert [type(d) for d in out] == [CallDelta, CallDelta, Delta]
    assert out[0].name == "get_weather" and out[1].arguments == '{"city": "Paris"}' and out[2].text == "Done"
    assert PythonicToolParser().has_open_call("[f(a='x")
    assert not PythonicToolParser().has_open_call("[f(a='x')]")
    assert not PythonicToolParser().has_open_call("[1] ref")


def test_parse_result_types():
    content, got = HermesToolParser().parse('<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    assert isinstance(got[0], ToolCall) and got[0].to_openai() == {
        "id": got[0].id, "type": "function", "function": {"name": "f", "arguments": "{}"}}


# ------------------------------------------------------------------ properties
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
    max_leaves=6)
args_st = st.dictionaries(st.text(max_size=6), json_values, max_size=3)
names = st.builds(str.__add__, st.sampled_from("abc_"), st.text("abc_019", max_size=8))
py_values = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(alphabet="ab '\"\\]{", max_size=5),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(alphabet="ab", max_size=3), kids, max_size=2),
    max_leaves=5)


def call_text(fmt, name, args, compact):
    sep = (",", ":") if compact else None
    obj = json.dumps(args, separators=sep)
    if fmt == "hermes":
        return f'<tool_call>\n{{"name": "{name}", "arguments": {obj}}}\n</tool_call>'
    if fmt == "llama3_json":
        return f'{{"name": "{name}", "parameters": {obj}}}'
    if fmt == "mistral":
        return f"[TOOL_CALLS]{name}[ARGS]{obj}" if compact else f'[TOOL_CALLS][{{"name": "{name}", "arguments": {obj}}}]'
    raise AssertionError(fmt)


NOISE = {
    "hermes": ["<tool_call>", "</tool_call>", "<tool", "_call>", "<", "{", "}", '"', "\\", " ", "\n", "hi", ";"],
    "llama3_json": ["<|python_tag|>", "<|py", "{", "}", '"name"', '"parameters"', ":", '"', ";", " ", "\n", "hi"],
    "mistral": ["[TOOL_CALLS]", "[TOOL", "[ARGS]", "[", "]", "{", "}", '"', "f", " ", "hi"],
    "pythonic": ["[", "]", "f(", ")", "a=", "1", "'", '"', ",", " ", "\n", "hi", "g.h("],
}


@st.composite
def replies(draw, fmt):
    parts = []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["noise", "noise", "call"]))
        if kind == "call" and fmt == "pythonic":
            kw = draw(st.dictionaries(st.text("abcd", min_size=1, max_size=4), py_values, max_size=3))
            calls_ = ", ".join(draw(names) + "(" + ", ".join(f"{k}={v!r}" for k, v in kw.items()) + ")"
                               for _ in range(draw(st.integers(1, 2))))
            parts.append(f"[{calls_}]")
        elif kind == "call":
            parts.append(call_text(fmt, draw(names), draw(args_st), draw(st.booleans())))
        else:
            parts.append("".join(draw(st.lists(st.sampled_from(NOISE[fmt]), max_size=6))))
    sep = "; " if fmt == "llama3_json" else draw(st.sampled_from(["", "\n", " text "]))
    return sep.join(parts)


@pytest.mark.parametrize("fmt", sorted(TOOL_PARSERS))
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_tool_parser_split_invariant(fmt, data):
    cls = TOOL_PARSERS[fmt]
    text = data.draw(replies(fmt), label="text")
    content, want = cls().parse(text)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=15), label="cuts"))
    bounds = [0, *cuts, len(text)]
    acc_content, acc_calls = "", []
    for d in run(cls(), [text[a:b] for a, b in zip(bounds, bounds[1:])]):
        if isinstance(d, Delta):
            assert d.kind == "content" and d.text
            acc_content += d.text
            assert content.startswith(acc_content)
        elif d.id is not None:
            assert d.index == len(acc_calls)
            acc_calls.append([d.name, d.arguments])
        else:
            acc_calls[d.index][1] += d.arguments
            assert want[d.index].arguments.startswith(acc_calls[d.index][1])
    assert acc_content == content
    assert acc_calls == [[c.name, c.arguments] for c in want]
    for c in want:  # an object's text (cut short when the call was cut or broke after it went out)
        assert c.arguments.startswith("{")


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "mistral"])
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_generated_calls_are_found(fmt, data):
    args = [data.draw(args_st) for _ in range(data.draw(st.integers(1, 3)))]
    compact = data.draw(st.booleans())
    sep = "; " if fmt == "llama3_json" else "\n"
    text = sep.join(call_text(fmt, f"fn{i}", a, compact) for i, a in enumerate(args))
    content, got = TOOL_PARSERS[fmt]().parse(text)
    assert content == ""
    sep = (",", ":") if compact else None
    assert [(c.name, c.arguments) for c in got] == [  # the arguments' own text
        (f"fn{i}", json.dumps(a, separators=sep)) for i, a in enumerate(args)]
    assert not TOOL_PARSERS[fmt]().has_open_call(text)
    # cut the text inside the last call's JSON: that call is open; it was sent (with the arguments
    # so far) when the cut is past its arguments' opening brace, else it is not claimed
    last = text.rindex(call_text(fmt, f"fn{len(args) - 1}", args[-1], compact))
    if fmt == "mistral" and compact:
        jstart = args_at = text.index("[ARGS]", last) + len("[ARGS]")
    else:
        jstart = min(i for i in (text.find("{", last), text.find("[", last + 1)) if i >= 0)
        key = '"parameters": ' if fmt == "llama3_json" else '"arguments": '
        args_at = text.index(key, last) + len(key)
    jend = find_json_end(text, jstart)
    cut = data.draw(st.integers(jstart + 1, jend - 1), label="cut")
    head = text[:cut]
    assert TOOL_PARSERS[fmt]().has_open_call(head)
    content, got_head = TOOL_PARSERS[fmt]().parse(head)
    want = [(c.name, c.arguments) for c in got[:-1]]
    if cut > args_at:
        args_end = find_json_end(text, args_at)
        assert [(c.name, c.arguments) for c in got_head] == want + [(got[-1].name, text[args_at:min(cut, args_end)])]
        assert content == ""
    else:
        assert [(c.name, c.arguments) for c in got_head] == want
        # (llama3_json: the "; " separator belongs to the unclaimed call region)
        assert content == ("; " if fmt == "llama3_json" and len(args) > 1 else "") + head[last:]


def test_prose_around_a_claimed_call_never_forms_a_marker():
    text = '<tool_<tool_call>{"name": "f", "arguments": {}}</tool_call>call>'
    content, got = HermesToolParser().parse(text)
    assert [c.name for c in got] == ["f"] and "<tool_call>" not in content
    parser = HermesToolParser()
    streamed = [d for piece in text for d in parser.feed(piece)] + parser.finish()
    assert "".join(d.text for d in streamed if hasattr(d, "kind")) == content
