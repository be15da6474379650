"""The GBNF checker: what it refuses (a 400 naming the limit, on the field given), what it lets
through, and that it counts what llama.cpp builds. tests/grammar/test_gbnf_llama.py checks the
accepted side against llama.cpp itself."""

from __future__ import annotations

import pytest

from app.api.errors import APIError
from app.generation.plan import check_client_grammar, check_generated_grammar
from app.config.settings import Limits
from app.grammar.gbnf_check import GBNFLimits, check_gbnf
from app.grammar.gbnf_reader import RULE_COST, read_gbnf
from app.grammar.request_grammars import json_grammar

# llama.cpp's grammars/json.gbnf
JSON_GBNF = r'''root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
'''


def refusal(grammar: str, limits: GBNFLimits | None = None, param: str = "grammar") -> APIError:
    with pytest.raises(APIError) as caught:
        check_gbnf(grammar, limits or GBNFLimits(), param)
    assert caught.value.status == 400 and caught.value.param == param, caught.value
    return caught.value


@pytest.mark.parametrize("grammar, written", [
    ('root ::= "a"{1,0}', "{1,0}"),
    ('root ::= "a"{5,2}', "{5,2}"),
    ('root ::= ("a" | "b"){ 5 , 2 } "c"', "{ 5 , 2 }"),
    ('root ::= x\nx ::= [a-z]{3}{7,6}', "{7,6}"),
])
def test_a_reversed_repetition_is_refused_where_it_is_written(grammar, written):
    # llama.cpp computes max - min as uint64: it wraps, and rules are generated until memory runs out
    exc = refusal(grammar)
    assert exc.code == "invalid_grammar"
    assert written in exc.message and "upper bound is below the lower one" in exc.message
    assert "line " in exc.message


def test_a_long_literal_repeated_is_refused_by_its_expanded_size():
    # ~60 KB of text; llama.cpp would copy the literal's 60,000 elements a thousand times (~0.5 GB)
    exc = refusal('root ::= "' + "a" * 60_000 + '"{1000}')
    assert exc.code == "grammar_too_complex"
    assert "limits.max_grammar_elements" in exc.message and "500000" in exc.message


def test_the_elements_limit_comes_from_the_config():
    grammar = 'root ::= "' + "a" * 100 + '"{100}'  # 10,000 elements
    check_client_grammar(grammar, Limits())
    with pytest.raises(APIError) as caught:
        check_client_grammar(grammar, Limits(max_grammar_elements=5000))
    assert caught.value.param == "grammar" and "at most 5000" in caught.value.message


def test_elements_are_counted_as_llama_cpp_builds_them():
    # root: "abc" twice (6), a reference, END; two generated rules: "abc" ALT END, "abc" ref ALT END
    g = read_gbnf('root ::= "abc"{2,4}', max_repetition=1000, max_units=10**9)
    rule = RULE_COST + 1  # each rule's cost, with its name (`root`, `root_1`, ...)
    assert g.units == (6 + 1 + 1) + (3 + 2) + (3 + 3) + 3 * rule
    # a group is one rule; repeating it copies one reference
    g = read_gbnf('root ::= ("' + "a" * 100 + '"){50}', max_repetition=1000, max_units=10**9)
    assert g.units == (50 + 1) + (100 + 1) + 2 * rule
    # unbounded: one rule that calls itself
    g = read_gbnf("root ::= [a-z]*", max_repetition=1000, max_units=10**9)
    assert g.units == (1 + 1) + (2 + 3) + 2 * rule


def test_stacked_repetitions_multiply():
    exc = refusal('root ::= "' + "a" * 100 + '"{1000}{1000}')
    assert exc.code == "grammar_too_complex" and "limits.max_grammar_elements" in exc.message


@pytest.mark.parametrize("grammar", ['root ::= "a"{1001}', 'root ::= "a"{0,1001}', 'root ::= "a"{1001,}',
                                     'root ::= "a"{99999999999999999999999}'])
def test_a_repetition_bound_over_the_limit_keeps_its_message(grammar):
    exc = refusal(grammar)
    assert exc.code == "grammar_too_complex"
    assert "repetition bounds of at most 1000 are accepted (limits.max_schema_repetition)" in exc.message


def test_the_size_and_nesting_limits_keep_their_messages():
    exc = refusal("root ::= " + '"a" ' * 20_000)
    assert exc.code == "grammar_too_large" and "(limits.max_grammar_bytes)" in exc.message
    exc = refusal("root ::= " + "(" * 100 + '"a"' + ")" * 100)
    assert exc.code == "grammar_too_complex"
    assert "nests groups 100 deep; at most 64 levels are accepted (limits.max_grammar_depth)" in exc.message
    # unbalanced: the depth is still what is reported
    exc = refusal("root ::= " + "(" * 100)
    assert "nests groups 100 deep" in exc.message


def test_the_param_and_the_subject_name_the_field():
    exc = refusal('root ::= "a"{5,2}', param="prompt.grammar")
    assert exc.message.startswith("`prompt.grammar` ")
    with pytest.raises(APIError) as caught:
        check_gbnf('root ::= "a"{5,2}', GBNFLimits(), "tools", subject="The grammar made from `tools`")
    assert caught.value.param == "tools" and caught.value.message.startswith("The grammar made from `tools` ")


@pytest.mark.parametrize("grammar, says", [
    ("root ::= (((", "expecting `)`"),
    ("root ::= x", "rule `x` is used but never defined"),
    ('x ::= "a"', "no `root` rule"),
    ('root ::= "a"{,3}', "expecting a number"),
    ('root ::= "\\q"', "unknown escape"),
    ('root ::= "\\x4"', "unknown escape"),
    ("root ::= [a-", "character class"),
    ('root ::= "a" ::= "b"', "expecting a newline"),
    ('root ::= ""*', "expecting an item before a repetition"),
    ('root ::= "a"{0}+', "expecting an item before a repetition"),
    ("root ::= !x", "expecting `<`"),
    ("root ::= <abc", "expecting `>`"),
    ("   ", "no `root` rule"),
])
def test_what_llama_cpp_refuses_is_refused_with_where(grammar, says):
    exc = refusal(grammar)
    assert exc.code == "invalid_grammar" and says in exc.message and "line 1" in exc.message


def test_text_llama_cpp_cannot_be_given_is_refused():
    assert "NUL" in refusal('root ::= "a"\x00 "b"').message
    assert "surrogate" in refusal('root ::= "\ud800"').message


def test_an_empty_grammar_is_no_grammar():
    check_gbnf("", GBNFLimits())


@pytest.mark.parametrize("grammar", [
    'root ::= a\na ::= (("")) a "x" | "y"',  # llama.cpp's own check misses it and loops until memory runs out
    'root ::= a\na ::= b a "x" | "y"\nb ::= c\nc ::= ""',
    'root ::= a\na ::= a | "x"',
    'root ::= ("" | "a")*',
])
def test_left_recursion_is_refused(grammar):
    exc = refusal(grammar)
    assert exc.code == "invalid_grammar" and "left-recursive" in exc.message


@pytest.mark.parametrize("grammar", [
    'root ::= a\na ::= "x" a b | ""\nb ::= "y" | ""',  # 2 s a token after 170 tokens
    'root ::= ("x" root)*',
    "root ::= expr\nexpr ::= [0-9] (\"+\" expr)*",
])
def test_stacks_that_grow_with_the_reply_are_refused(grammar):
    exc = refusal(grammar)
    assert exc.code == "grammar_too_complex" and "grow with the reply" in exc.message


def test_optional_items_under_a_repetition_are_refused_by_their_stacks():
    exc = refusal('root ::= ("a"?){0,1000}')  # 3 s a token at {0,100}
    assert exc.code == "grammar_too_complex" and "(limits.max_grammar_stacks)" in exc.message
    exc = refusal('root ::= ("" | "a"){0,1000}')
    assert exc.code == "grammar_too_complex" and "(limits.max_grammar_stacks)" in exc.message
    exc = refusal('root ::= .?{0,8}')  # 0.6 s a token
    assert exc.code == "grammar_too_complex" and "(limits.max_grammar_ambiguity)" in exc.message
    exc = refusal('root ::= ("  "?){0,31}')  # minutes a token: whitespace tokens take every split
    assert "(limits.max_grammar_ambiguity)" in exc.message
    exc = refusal('root ::= ((. "a")?){0,63}')  # 18 s a token
    assert "(limits.max_grammar_ambiguity)" in exc.message


def test_small_nested_grammars_with_exponential_stacks_are_refused():
    nested = "root ::= " + "(" * 30 + '("x" | "")' + "){2}" * 30  # 250 bytes: 2^30 stacks at the start
    assert "(limits.max_grammar_stacks)" in refusal(nested).message
    doubling = "\n".join(["root ::= a1"] + [f'a{i} ::= a{i + 1} a{i + 1} | ""' for i in range(1, 40)] +
                         ['a40 ::= "x" | ""'])
    assert refusal(doubling).code == "grammar_too_complex"


def test_stacks_limits_come_from_the_config():
    grammar = 'root ::= "a"? "b"? "c"? "d"? "e"? "f"? "g"? "h"?'  # 9 stacks, each on its own character
    check_client_grammar(grammar, Limits())
    with pytest.raises(APIError) as caught:
        check_client_grammar(grammar, Limits(max_grammar_stacks=8))
    assert "at most 8 are accepted (limits.max_grammar_stacks)" in caught.value.message
    grammar = 'root ::= " "? " "? " "?'
    check_client_grammar(grammar, Limits())
    with pytest.raises(APIError) as caught:
        check_client_grammar(grammar, Limits(max_grammar_ambiguity=2))
    assert "in 3 ways" in caught.value.message and "(limits.max_grammar_ambiguity)" in caught.value.message


@pytest.mark.parametrize("grammar", [
    JSON_GBNF,
    'root ::= "<think>" [a-z ]{1,40} "</think>" [a-z ]{1,40}',
    "root ::= (" + " | ".join(f'"\\"value{i}\\""' for i in range(60)) + ")",  # an enum: 60 stacks on `"`
    'root ::= [0-9]{0,15} ("." [0-9]{1,20})? ([eE] [-+]? [0-9]{1,3})?',
    'root ::= ("a"?)*',  # llama.cpp's advance meets the same stack again and stops
    'root ::= "x" root?',
    'root ::= item ("," item)*\nitem ::= "[" (item ("," item)*)? "]" | [a-z]+',
    'root ::= "' + "a" * 1000 + '"{100}',
    'root ::= .{0,3} .{0,3} .{0,3} <[1]> !<[2]>',
    'root ::= [^\\x00-\\U0010FFFF]',  # satisfiable by nothing: the engine's error, not ours
])
def test_ordinary_grammars_pass(grammar):
    check_gbnf(grammar, GBNFLimits())


def test_schema_grammars_pass_the_safety_net_and_big_ones_do_not():
    limits = Limits()
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 1000} for i in range(20)},
              "required": [f"p{i}" for i in range(20)]}
    check_generated_grammar(json_grammar(schema, "response_format"), limits, "response_format")
    enum = json_grammar({"enum": [f"value{i}" for i in range(1000)]}, "response_format")
    check_generated_grammar(enum, limits, "response_format")  # 1000 stacks: not bounded for our own grammars
    with pytest.raises(APIError) as caught:
        check_generated_grammar(json_grammar(schema, "tools"), Limits(max_grammar_elements=100_000), "tools")
    assert caught.value.param == "tools" and caught.value.message.startswith("The grammar made from `tools` ")
