from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.parsers import (
    REASONING_PARSERS, Delta, NoReasoningParser, ThinkReasoningParser, detect_reasoning_parser,
    get_reasoning_parser, template_starts_in_reasoning,
)
from app.parsers.reasoning import merge_deltas


def run(parser, pieces):
    out = []
    for p in pieces:
        out += parser.feed(p)
    out += parser.finish()
    return out


def fields(deltas):
    r = "".join(d.text for d in deltas if d.kind == "reasoning")
    c = "".join(d.text for d in deltas if d.kind == "content")
    return (r or None), c


def test_registry():
    assert set(REASONING_PARSERS) == {"think", "none"}
    assert get_reasoning_parser("think") is ThinkReasoningParser
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        get_reasoning_parser("nope")


def test_think_basic_and_whitespace_rules():
    p = ThinkReasoningParser()
    assert p.parse("<think>\nplan it\n</think>\n\nAnswer.\n") == ("plan it", "Answer.\n")
    # whitespace inside the parts is kept; only whitespace touching a tag is dropped
    assert p.parse("<think> a\n\nb </think> x  y ") == ("a\n\nb", "x  y ")
    assert p.parse("\n<think>r</think>c") == ("r", "c")
    assert p.parse("Just an answer.") == (None, "Just an answer.")
    assert p.parse("  indented answer") == (None, "  indented answer")
    assert p.parse("<think>\n\n</think>\n\nHi") == (None, "Hi")


def test_think_streaming_never_emits_tag_fragments():
    p = ThinkReasoningParser()
    assert p.feed("<thi") == []
    assert p.feed("nk>Let me") == [Delta("reasoning", "Let me")]
    assert p.feed(" see</thi") == [Delta("reasoning", " see")]
    assert p.feed("nk>\n\nIt is") == [Delta("content", "It is")]
    assert p.feed(" 4. <") == [Delta("content", " 4.")]  # " <" held: maybe a tag
    assert p.feed("b>") == [Delta("content", " <b>")]
    assert p.finish() == []


def test_think_false_alarm_prefix_is_released():
    assert run(ThinkReasoningParser(), ["a <thin", "g> b"]) == [Delta("content", "a"), Delta("content", " <thing> b")]
    assert fields(run(ThinkReasoningParser(), ["x </thin"])) == (None, "x </thin")


def test_unclosed_reasoning_is_also_content():
    p = ThinkReasoningParser()
    out = run(p, ["<think>\nStill thinking", " about it"])
    assert out == [Delta("reasoning", "Still thinking"), Delta("reasoning", " about it"),
                   Delta("content", "Still thinking about it")]
    assert p.parse("<think>\nStill thinking about it") == ("Still thinking about it", "Still thinking about it")


def test_unclosed_reasoning_after_content_is_not_duplicated():
    assert ThinkReasoningParser().parse("Hi.<think>hmm") == ("hmm", "Hi.")


def test_starts_in_reasoning():
    p = ThinkReasoningParser(starts_in_reasoning=True)
    assert p.parse("reasoning\n</think>\n\nanswer") == ("reasoning", "answer")
    assert p.parse("<think>\nreasoning</think>answer") == ("reasoning", "answer")  # stray <think> tolerated
    assert p.parse("only reasoning") == ("only reasoning", "only reasoning")
    assert p.parse("</think>answer") == (None, "answer")


def test_stray_tags_are_dropped():
    # Dropped, but the text on both sides stays apart (one space unless whitespace is there).
    p = ThinkReasoningParser()
    assert p.parse("a</think>b") == (None, "a b")
    assert p.parse("a </think>b") == (None, "a b")
    assert p.parse("<think>x<think>y</think>z") == ("x y", "z")
    assert p.parse("answer</think>") == (None, "answer")


def test_dropping_a_stray_tag_never_forms_a_new_tag():
    p = ThinkReasoningParser()
    for text in ("<th</think>ink>", "<th </think>ink>", "</th</think>ink>"):
        reasoning, content = p.parse(text)
        assert reasoning is None and "<think>" not in content and "</think>" not in content, content
        streamed = run(ThinkReasoningParser(), list(text))
        assert "".join(d.text for d in streamed if d.kind == "content") == content


def test_custom_tags():
    p = ThinkReasoningParser(start_tag="[THINK]", end_tag="[/THINK]")
    assert p.parse("[THINK]r[/THINK]c") == ("r", "c")
    assert run(ThinkReasoningParser(start_tag="[THINK]", end_tag="[/THINK]"), ["[TH", "INK]r[/", "THINK]c"]) == [
        Delta("reasoning", "r"), Delta("content", "c")]


def test_none_parser():
    p = NoReasoningParser()
    assert p.parse("<think>x</think>y") == (None, "<think>x</think>y")
    assert run(NoReasoningParser(), ["<thi", "nk>"]) == [Delta("content", "<thi"), Delta("content", "nk>")]


def test_parse_does_not_disturb_streaming_state():
    p = ThinkReasoningParser()
    assert p.feed("<think>a") == [Delta("reasoning", "a")]
    assert p.parse("b</think>c") == (None, "b c")
    assert p.feed("</think>d") == [Delta("content", "d")]


def test_merge_deltas():
    assert merge_deltas([Delta("content", "a"), Delta("content", ""), Delta("content", "b"),
                         Delta("reasoning", "c")]) == [Delta("content", "ab"), Delta("reasoning", "c")]


QWEN3 = """{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""
QWEN3_THINKING = """{% set content = message.content.split('</think>')[-1] %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n<think>\\n' }}
{%- endif %}"""
DEEPSEEK_R1 = """{% if message['role'] == 'assistant' %}{% set content = content.split('</think>')[-1] %}{% endif %}
{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\\n'}}{% endif %}"""
LLAMA = "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"


def test_detect_reasoning_parser():
    assert detect_reasoning_parser(QWEN3) == "think"
    assert detect_reasoning_parser(DEEPSEEK_R1) == "think"
    assert detect_reasoning_parser(LLAMA) == "none"
    assert detect_reasoning_parser(None) == "none"


def test_template_starts_in_reasoning():
    assert template_starts_in_reasoning(DEEPSEEK_R1) is True
    assert template_starts_in_reasoning(QWEN3_THINKING) is True
    assert template_starts_in_reasoning(QWEN3) is False
    assert template_starts_in_reasoning(LLAMA) is False
    assert template_starts_in_reasoning(None) is False
    assert template_starts_in_reasoning('{{ "<think>" }}') is False  # no generation prompt branch


TOKENS = ["<think>", "</think>", "<", "</", "<th", "ink>", "</thi", "a", "b", " ", "\n", "x y"]


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.sampled_from(TOKENS), max_size=25), sir=st.booleans(), data=st.data())
def test_think_split_invariant(parts, sir, data):
    text = "".join(parts)
    whole = ThinkReasoningParser(starts_in_reasoning=sir).parse(text)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    deltas = run(ThinkReasoningParser(starts_in_reasoning=sir), [text[a:b] for a, b in zip(bounds, bounds[1:])])
    r = c = ""
    for d in deltas:  # prefix-consistent at every step
        assert d.text
        if d.kind == "reasoning":
            r += d.text
            assert (whole[0] or "").startswith(r)
        else:
            c += d.text
            assert whole[1].startswith(c)
    assert ((r or None), c) == whole
    # tags never come out (except when the text itself glues a tag around a removed one)
    if "<think>" not in text.replace("<think>", "").replace("</think>", ""):
        assert "<think>" not in c and "<think>" not in r
