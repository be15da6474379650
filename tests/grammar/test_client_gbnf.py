"""A client's GBNF `grammar` (llama-server's field): our limits on what it may ask for, then llguidance's
converter and compile; every refusal a 400 naming `grammar`, fast. Grammars llama.cpp's own sampler could
not take safely (left recursion, deep ambiguity) are served now: llguidance's Earley parser bounds each
token's work by construction."""

from __future__ import annotations

import time

import pytest
from llguidance import LLMatcher

from app.api.errors import APIError
from app.generation.plan import client_gbnf
from app.config.app_args import Limits


def refusal(grammar: str, **limits) -> APIError:
    started = time.monotonic()
    with pytest.raises(APIError) as info:
        client_gbnf(grammar, Limits(**limits))
    assert time.monotonic() - started < 1.0
    assert info.value.status == 400 and info.value.param == "grammar"
    return info.value


@pytest.mark.parametrize("grammar,code,words", [
    ("root ::= " + "(" * 100 + '"a"' + ")" * 100, "grammar_too_complex", "nests groups 100 deep; at most 64"),
    ('root ::= "a"{1000000}', "grammar_too_complex", "repeats an item 1000000 times; repetition bounds of at most 1000"),
    ('root ::= "a"{2,5000}', "grammar_too_complex", "(limits.max_schema_repetition)"),
    ('root ::= "' + "a" * 70000 + '"', "grammar_too_large", "(limits.max_grammar_bytes)"),
    ('root ::= "a\x00"', "invalid_grammar", "NUL"),
    # 60 MB of text for one lexeme: minutes and gigabytes of llguidance's first mask
    ('root ::= "' + "a" * 60000 + '"{1000}', "grammar_too_complex", "more than 10000 characters"),
    ('root ::= x{2}\nx ::= ("ab"{100}){100}', "grammar_too_complex", "stands for more than 10000 characters"),
    ("root ::= (((", "invalid_grammar", "not valid GBNF"),
    ('other ::= "x"', "invalid_grammar", "root"),
    ('root ::= "a"{5,2}', "invalid_grammar", ""),
    ('root ::= "a"{1,0}', "invalid_grammar", ""),
    ('root ::= "\\uD800"', "invalid_grammar", "names no character"),
    ('root ::= undefined-rule', "invalid_grammar", ""),
])
def test_refused_grammars_say_why(grammar, code, words):
    err = refusal(grammar)
    assert err.code == code and words in err.message, err.message


def test_limits_are_settings():
    client_gbnf("root ::= " + "(" * 10 + '"a"' + ")" * 10, Limits())
    assert "at most 5 levels" in refusal("root ::= " + "(" * 10 + '"a"' + ")" * 10, max_grammar_depth=5).message
    assert "at most 10 are accepted" in refusal('root ::= "a"{11}', max_schema_repetition=10).message


def test_parentheses_and_braces_inside_literals_and_classes_are_text():
    text = 'root ::= "((((({99999}" [(){}] "\\"(" # (((( {99999} comment\n'
    assert client_gbnf(text, Limits())


@pytest.mark.parametrize("grammar", [
    'root ::= [\\u00e9\\U0001F600] "\\u0041" [\\x00-\\x7F]',
    'root ::= a\na ::= a "x" | "y"',  # left recursion: refused by llama.cpp's sampler, an Earley parser's daily bread
    'root ::= (("")) root "x" | "y"',
    'root ::= [^\\x00-\\U0010FFFF]',  # no character at all: a grammar, refused when it is followed
])
def test_llama_cpp_syntax_is_served(grammar):
    converted = client_gbnf(grammar, Limits())
    assert LLMatcher.validate_grammar(converted) == ""


def dag(depth: int, fan: int = 4, last: str = '"ab"') -> str:
    """Rules that each refer to the next `fan` times: fan^depth terminal parts when written out."""
    rules = ["root ::= r0"] + [f"r{i} ::= " + " ".join([f"r{i + 1}"] * fan) for i in range(depth)]
    return "\n".join(rules + [f"r{depth} ::= {last}"])


def test_rules_that_each_refer_to_the_next_several_times_cost_their_size_not_their_expansion(monkeypatch):
    """Each preparation step is linear in the grammar: the expansion of a terminal rule is counted once (it was
    walked once per path to it: 4^14 paths held a planning thread for minutes past the request's refusal)."""
    from app.grammar import llguidance_grammars as grammars

    calls = []
    real = grammars._expansion
    monkeypatch.setattr(grammars, "_expansion", lambda *a: (calls.append(1), real(*a))[1])
    for depth in (8, 14, 40):
        calls.clear()
        error = refusal(dag(depth))
        assert error.code == "grammar_too_complex" and "more than 10000 characters" in error.message
        assert len(calls) < 20 * (depth + 2), (depth, len(calls))
    # The same shape where the last rule recurses: no terminal to expand, a grammar llguidance serves.
    client_gbnf(dag(40, last='"ab" r40 | "c"'), Limits())


def test_terminal_rules_are_found_as_llguidances_converter_finds_them():
    """_mark_terminals (a worklist) decides each rule's terminality as the converter's own fixpoint does, on
    random grammars of references, cycles, literals and classes."""
    import random

    from llguidance import gbnf_to_lark as gbnf

    from app.grammar.llguidance_grammars import _mark_terminals

    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(1, 12)
        rules = []
        for i in range(n):
            parts = []
            for _ in range(rng.randint(1, 3)):
                pick = rng.random()
                parts.append(f"r{rng.randrange(n)}" if pick < 0.5 else '"x"' if pick < 0.8 else "[a-z]")
            alternatives = " | ".join(" ".join(parts[k:]) for k in range(rng.randint(1, len(parts))))
            rules.append(f"r{i} ::= {alternatives}")
        text = "\n".join([f"root ::= r0 {'r1' if n > 1 else ''}"] + rules)
        theirs, ours = gbnf.GrammarParser().parse(text), gbnf.GrammarParser().parse(text)
        gbnf.resolve(theirs)
        _mark_terminals(ours)
        gbnf.resolve(ours)
        assert {r.name for r in theirs.values() if r.rule_is_terminal} == \
            {r.name for r in ours.values() if r.rule_is_terminal}, text
