"""JSON schemas -> llguidance grammars: our limits refuse hostile schemas fast and say where, and the
grammars accept exactly the JSON valid against the schema (the supported keywords), at most one space
between tokens.

Acceptance is checked by llguidance's matcher on the bundled model's vocabulary: the candidate text is
tokenized and fed token by token, then the grammar must be complete."""

from __future__ import annotations

import json
import time
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llguidance import LLMatcher

from app.api.errors import APIError
from app.engine.constraint import grammar_tokenizer
from app.engine.llama import LlamaModelContext
from app.grammar.llguidance_grammars import GrammarError, check as check_grammar, from_json_schema
from app.grammar.request_grammars import forced_call_grammar, json_grammar, tool_call_schema
from app.grammar.schema_limits import GrammarLimits, SchemaError, check_schema

pytestmark = pytest.mark.model


class Judge:
    def __init__(self, llama: LlamaModelContext) -> None:
        self.llama = llama
        self.tokenizer = grammar_tokenizer(llama.vocab)

    def tokens(self, text: str) -> list[int]:
        return self.llama.tokenize(text, add_special=False, parse_special=False)

    def round_trips(self, text: str) -> bool:
        """Whether the tokens spell `text` (the tokenizer drops some unassigned code points)."""
        return b"".join(self.llama.piece(t) for t in self.tokens(text)) == text.encode()

    def accepts(self, grammar: str, text: str) -> bool:
        """Whether the grammar lets a model write exactly `text`."""
        matcher = LLMatcher(self.tokenizer, grammar, log_level=0)
        assert not matcher.is_error(), matcher.get_error()
        tokens = self.tokens(text)
        return matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens) \
            and matcher.is_accepting()


@pytest.fixture(scope="module")
def judge(bundled_spec):
    llama = LlamaModelContext(bundled_spec.path, n_ctx_per_seq=64, n_seq_max=1, n_batch=64, n_threads=1,
                              n_threads_batch=1, n_gpu_layers=0, kv_unified=True)
    yield Judge(llama)
    llama.close()


def schema_rules(schema: Any, _rule: str = "", limits: GrammarLimits = GrammarLimits()) -> str:
    """The grammar of `schema` as a request gets it: our limits, then llguidance's compile."""
    check_schema(schema, limits)
    grammar = from_json_schema(schema)
    try:
        check_grammar(grammar)
    except GrammarError as exc:
        raise SchemaError(exc.message) from None
    return grammar


def grammar(schema: Any, **limits: int) -> str:
    return schema_rules(schema, "", GrammarLimits(**limits))


def check(judge: Judge, schema: Any, good: list[str], bad: list[str]) -> None:
    g = grammar(schema)
    for text in good:
        assert judge.accepts(g, text), f"{text!r} should fit {schema}\n{g}"
    for text in bad:
        assert not judge.accepts(g, text), f"{text!r} should not fit {schema}\n{g}"


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


# --- limits: each refusal names keyword, place and limit, and comes fast -------------------

@pytest.mark.parametrize("schema,expected", [
    ({"type": "object", "properties": {"name": {"type": "string", "maxLength": 100000}}},
     ["maxLength 100000", "properties.name", "limit of 1000"]),
    ({"type": "array", "items": {"type": "string"}, "maxItems": 10**9},
     ["maxItems 1000000000", "the root", "limit of 1000"]),
    ({"type": "array", "items": {"type": "string", "maxLength": 100000}, "minItems": 5000},
     ["minItems 5000", "the root", "limit of 1000"]),
    ({"type": "string", "minLength": 100000}, ["minLength 100000", "limit of 1000"]),
    (nested(60), ["nests deeper than 32 levels", "properties.a.properties.a"]),
    ({"type": "object", "properties": {"x": {"enum": list(range(100000))}}},
     ["enum of 100000 values", "properties.x", "limit of 1000"]),
    ({"enum": ["x" * 100000]}, ["enum at the root exceed 16384 bytes"]),
    ({"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 1000} for i in range(30)}},
     ["repetition counts add up past 20000"]),
    ({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(3000)}},
     ["more than 2000 subschemas"]),
    ({"type": "object", "properties": {"x" * 300: {"type": "null"}}}, ["property name of 300", "limit of 256"]),
    ({"type": "string", "pattern": "a" * 2000}, ["pattern of 2000 characters", "limit of 1000"]),
    ({"type": "string", "pattern": "^(a{1000}){1000}$"}, ["up to 1000000 characters", "limit of 10000"]),
    ({"anyOf": [{"$ref": "#/$defs/a", "minLength": 1}] * 1000,
      "$defs": {"a": {"type": "object", "properties": {f"p{i}": False for i in range(100000)}}}},
     ["more than 2000 subschemas"]),
])
def test_limits_refuse_fast_and_say_where(schema, expected):
    started = time.monotonic()
    with pytest.raises(SchemaError) as info:
        schema_rules(schema, "json-value")
    assert time.monotonic() - started < 1.0
    for part in expected:
        assert part in str(info.value), str(info.value)


def ref_dag(depth: int, fan: int, combinator: str) -> dict[str, Any]:
    """`$defs` each naming the next `fan` times: under `allOf` llguidance merges what each `$ref` names, so the
    schema stands for fan^depth subschemas; as properties it stays one reference each."""
    defs: dict[str, Any] = {}
    for i in range(depth):
        refs = [{"$ref": f"#/$defs/d{i + 1}"}] * fan
        defs[f"d{i}"] = {combinator: refs} if combinator == "allOf" else {
            "type": "object", "properties": {f"p{j}": r for j, r in enumerate(refs)}, "additionalProperties": False}
    defs[f"d{depth}"] = {"type": "string", "maxLength": 3}
    return {"$defs": defs, "allOf": [{"$ref": "#/$defs/d0"}], "description": "as Pydantic wraps a described field"}


def test_refs_merged_under_allof_are_counted_written_out_and_refused_in_time():
    started = time.monotonic()
    with pytest.raises(SchemaError, match="more than 10000 subschemas once each `\\$ref` under `allOf`"):
        check_schema(ref_dag(12, 4, "allOf"))  # 16 million merges: 83 s of llguidance's compile
    assert time.monotonic() - started < 1.0
    check_schema(ref_dag(10, 4, "properties"))  # references under properties: compiled as rules, at once
    check_grammar(from_json_schema(ref_dag(10, 4, "properties")))


def test_limits_are_parameters():
    schema = {"type": "string", "maxLength": 11}
    schema_rules(schema, "x")
    with pytest.raises(SchemaError, match="maxLength 11 at the root exceeds the limit of 10"):
        schema_rules(schema, "x", GrammarLimits(max_repetition=10))
    with pytest.raises(SchemaError, match="nests deeper than 3 levels"):
        schema_rules(nested(5), "x", GrammarLimits(max_depth=3))


def test_json_grammar_turns_refusals_into_400():
    with pytest.raises(APIError) as info:
        json_grammar({"type": "string", "maxLength": 10**6}, "response_format.json_schema.schema", GrammarLimits())
    assert info.value.status == 400 and info.value.param == "response_format.json_schema.schema"
    assert "maxLength 1000000 at the root exceeds the limit of 1000" in info.value.message
    with pytest.raises(APIError) as info:  # refused by llguidance: named the same way
        json_grammar({"type": "array", "uniqueItems": True}, "response_format.json_schema.schema", GrammarLimits())
    assert info.value.param == "response_format.json_schema.schema" and "uniqueItems" in info.value.message


# --- refs ------------------------------------------------------------------------------------

@pytest.mark.parametrize("schema,message", [
    ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "refers to itself"),
    ({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}, {"type": "null"}]}, "b": {"$ref": "#/$defs/a"}},
      "$ref": "#/$defs/a"}, "refers to itself"),
    ({"$defs": {"a": {"$ref": "#/$defs/a", "minLength": 1}}, "$ref": "#/$defs/a"}, "refers to itself"),
    ({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}, "refers to itself"),
    ({"$ref": "#"}, "refers to itself"),
    ({"$ref": "#/$defs/missing"}, "points to nothing"),
    ({"$ref": "https://example.com/schema.json"}, "only local references"),
    ({"$ref": "other.json#/a"}, "only local references"),
])
def test_ref_loops_and_bad_refs_end_in_schema_error(schema, message):
    started = time.monotonic()
    with pytest.raises(SchemaError, match=message):
        schema_rules(schema, "json-value")
    assert time.monotonic() - started < 1.0


TREE = {
    "$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["value"]}},
    "$ref": "#/$defs/node",
}


def test_recursive_schema_becomes_a_recursive_grammar(judge):
    check(judge, TREE,
          ['{"value": 1}', '{"value": 1, "children": [{"value": 2, "children": [{"value": 3}]}, {"value": 4}]}'],
          ['{"children": []}', '{"value": 1, "children": [{}]}'])
    # the root itself, through `#`
    check(judge, {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}, ["[]", "[[], [[]]]"], ["[[], [], []]"])


def test_tool_parameters_keep_their_own_refs(judge):
    params = {"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "required": ["p"],
              "$defs": {"P": {"type": "string", "enum": ["a", "b"]}}}
    g = forced_call_grammar("llama3_json", [tool_call_schema("f", params)])
    assert judge.accepts(g, '{"name": "f", "arguments": {"p": "a"}}')
    assert not judge.accepts(g, '{"name": "f", "arguments": {"p": "c"}}')
    assert not judge.accepts(g, '{"arguments": {"p": "a"}, "name": "f"}')  # name comes first


def test_a_forced_call_is_wrapped_in_its_parsers_syntax(judge):
    calls = [tool_call_schema("f", {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}),
             tool_call_schema("g", None)]
    hermes = forced_call_grammar("hermes", calls)
    assert judge.accepts(hermes, '<tool_call>\n{"name": "f", "arguments": {"q": "a\\"b"}}\n</tool_call>')
    assert judge.accepts(hermes, '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>')
    assert not judge.accepts(hermes, '{"name": "g", "arguments": {}}')
    assert not judge.accepts(hermes, '<tool_call>\n{"name": "h", "arguments": {}}\n</tool_call>')
    assert judge.accepts(forced_call_grammar("mistral", calls), '[TOOL_CALLS][{"name": "g", "arguments": {}}]')


# --- what the grammars accept ---------------------------------------------------------------

def test_strings_are_json_strings(judge):
    check(judge, {"type": "string"},
          ['"a\\tb"', '""', '"\\"\\\\"', '"\\u0001"', '"é ✓"'],
          ['"a\tb"', '"a\nb"', '"\\x41"', '"\\ud800"', '"\\a"', "'a'", '"a'])
    # a subset: printable characters are written as themselves, never as \u escapes (nor `/` as `\/`)
    check(judge, {"type": "string"}, [], ['"\\u00e9"', '"\\/"'])


def test_string_lengths_are_exact(judge):
    g = grammar({"type": "string", "minLength": 2, "maxLength": 4})
    for n in range(8):
        for piece in ("a", "é", "\\n", "\\u0001"):  # an escape is one character
            text = '"' + piece * n + '"'
            assert judge.accepts(g, text) == (2 <= n <= 4), text


@pytest.mark.parametrize("bounds,lo,hi", [
    ({"minimum": -5, "maximum": 123}, -5, 123),
    ({"exclusiveMinimum": -5, "exclusiveMaximum": 123}, -4, 122),
    ({"minimum": -5.5, "maximum": 122.9}, -5, 122),
    ({"exclusiveMinimum": -5.5, "exclusiveMaximum": 122.5}, -5, 122),
    ({"minimum": -5, "exclusiveMinimum": True, "maximum": 9, "exclusiveMaximum": False}, -4, 9),
    ({"minimum": 7}, 7, None),
    ({"maximum": -7}, None, -7),
    ({"minimum": -13, "maximum": -2}, -13, -2),
    ({"minimum": 0, "maximum": 0}, 0, 0),
    ({"minimum": 10, "maximum": 100}, 10, 100),
])
def test_integer_bounds_are_exact(judge, bounds, lo, hi):
    g = grammar({"type": "integer", **bounds})
    for v in range(-20, 201):
        fits = (lo is None or v >= lo) and (hi is None or v <= hi)
        assert judge.accepts(g, str(v)) == fits, (v, g)
    assert not judge.accepts(g, "007") and not judge.accepts(g, "1.0")


def test_wide_integer_bounds(judge):
    lo, hi = 98_765, 12_345_678
    g = grammar({"type": "integer", "minimum": lo, "maximum": hi})
    for v in (lo - 1, lo, lo + 1, 99_999, 100_000, 1_000_000, 9_999_999, 12_345_677, hi, hi + 1, 12_345_680,
              99_999_999, -lo, 0):
        assert judge.accepts(g, str(v)) == (lo <= v <= hi), v


def test_numbers(judge):
    check(judge, {"type": "number"},
          ["0", "-0", "1.5", "-0.25", "1e-05", "1.5E+300", "0.30000000000000004", "12345678"],
          ["01", "1.", ".5", "+1", "1e", "NaN", "Infinity", "--1", "0x10"])
    check(judge, {"type": "number", "minimum": 0, "maximum": 1},
          ["0", "1", "0.5", "0.999"], ["-0.1", "1.5", "2", "-1", "1e0"])
    check(judge, {"type": "number", "exclusiveMinimum": -2, "maximum": 3},
          ["-1", "-0.5", "0", "2.75", "3", "-1.5"], ["-2", "-2.5", "3.5", "4"])


def test_objects_required_and_closed(judge):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
              "required": ["b"], "additionalProperties": False}
    check(judge, schema, ['{"b": "x"}', '{"a": 1, "b": "x"}', '{"a":1,"b":"x"}'],
          ['{}', '{"a": 1}', '{"b": "x", "c": 1}', '{"b": "x", "b": "y"}', '{"b": 1}'])
    # extra properties allowed, but never under a declared name
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "null"}}
    check(judge, schema, ['{}', '{"a": 1, "ab": null}', '{"b": null, "c": null}', '{"": null}'],
          ['{"a": null}', '{"ab": 1}', '{"b": null, "a": 1}'])
    # required names that are not declared still appear
    check(judge, {"type": "object", "required": ["z"]}, ['{"z": [1]}', '{"z": 1, "y": 2}'], ['{}', '{"y": 2}'])
    check(judge, {"type": "object", "properties": {}, "additionalProperties": False}, ["{}", "{ }"], ['{"a": 1}'])
    check(judge, {"type": "object", "properties": {}}, ["{}", '{"a": 1}'], ["[]"])  # open unless closed


def test_arrays(judge):
    check(judge, {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3},
          ["[1, 2]", "[1,2,3]"], ["[]", "[1]", "[1, 2, 3, 4]", "[1, 2,]", '[1, "a"]'])
    check(judge, {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                  "items": {"type": "boolean"}, "maxItems": 3},
          ['[1, "a"]', '[1, "a", true]', "[1]", "[]"], ['[1, "a", true, false]', '["a", 1]'])
    check(judge, {"type": "array", "items": False}, ["[]"], ["[1]"])


def test_enum_const_and_unions(judge):
    check(judge, {"enum": ["a", 1, None, {"x": [1]}]}, ['"a"', "1", "null", '{"x":[1]}'], ['"b"', "2", "true"])
    check(judge, {"type": "string", "enum": ["a", "bb", 3], "maxLength": 1}, ['"a"'], ['"bb"', "3"])
    check(judge, {"const": "get_weather"}, ['"get_weather"'], ['"get"', '"x"'])
    check(judge, {"type": ["string", "null"], "maxLength": 2}, ['"ab"', "null"], ['"abc"', "1"])
    check(judge, {"anyOf": [{"type": "integer", "maximum": 3}, {"type": "boolean"}]}, ["3", "true"], ["4", '"x"'])
    check(judge, {"type": "object", "properties": {"k": {"type": "string"}},
                  "anyOf": [{"required": ["k"]}, {"properties": {"n": {"type": "integer"}}, "required": ["n"]}]},
          ['{"k": "x"}', '{"k": "x", "n": 1}'], ["{}"])


def test_all_of_is_an_intersection(judge):
    check(judge, {"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"]},
        {"properties": {"a": {"maximum": 9}, "b": {"type": "string"}}, "required": ["b"]}]},
        ['{"a": 1, "b": "x"}', '{"a": 9, "b": ""}'], ['{"a": 1}', '{"b": "x"}', '{"a": 10, "b": "x"}'])


def test_formats_and_patterns(judge):
    check(judge, {"type": "string", "format": "date"}, ['"2024-01-31"'], ['"2024-13-01"', '"x"'])
    check(judge, {"type": "string", "format": "date-time"},
          ['"2024-01-31T10:00:00Z"', '"2024-01-31T10:00:00.123+01:00"'], ['"2024-01-31"'])
    check(judge, {"type": "string", "format": "uuid"}, ['"123e4567-e89b-12d3-a456-426614174000"'], ['"123"'])
    check(judge, {"type": "string", "format": "email"}, ['"ann@example.com"'], ['"anything"', "1"])
    check(judge, {"type": "string", "pattern": "^[A-Z]{3}-\\d+$"}, ['"ABC-12"'], ['"AB-12"', '"ABC-"', '"xABC-1"'])
    check(judge, {"type": "string", "pattern": "abc"}, ['"abc"', '"x\\nabcy"'], ['"ab"'])
    check(judge, {"type": "string", "pattern": "^(?:foo|ba[rz])+$"}, ['"foobar"', '"baz"'], ['""', '"fo"'])
    check(judge, {"type": "string", "pattern": '^a"b\\\\$'}, ['"a\\"b\\\\"'], ['"a"', '"a"b\\"'])
    check(judge, {"type": "string", "pattern": "^[^a]$"}, ['"b"', '"\\""', '"é"'], ['"a"', '"bb"'])
    check(judge, {"type": "string", "pattern": "^.{2,3}$"}, ['"ab"', '"abc"'], ['"a"', '"abcd"'])


@pytest.mark.parametrize("schema,message", [
    ({"not": {"type": "string"}}, 'Unimplemented keys: ["not"]'),
    ({"type": "object", "properties": {"x": {"type": "array", "uniqueItems": True}}}, "uniqueItems"),
    ({"if": {}, "then": {}}, 'Unimplemented keys: ["if", "then"]'),
    ({"type": "string", "pattern": "^(?=a)a$"}, "look-around"),
    ({"type": "string", "pattern": "^(a)\\1$"}, "backreferences are not supported"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "minimum (5) is greater than maximum (4)"),
    ({"type": "string", "minLength": 3, "maxLength": 2}, "more than maxLength"),
    ({"type": "object", "properties": {"a": False}, "required": ["a"]}, "required property 'a' is unsatisfiable"),
    ({"type": "frob"}, "Invalid type: frob"),
    ({"enum": []}, "non-empty"),
    ([1], "must be an object"),
    (False, "no value can match"),
])
def test_unsupported_or_unsatisfiable_is_refused(schema, message):
    with pytest.raises((SchemaError, GrammarError)) as info:
        schema_rules(schema, "json-value")
    assert message in str(info.value)


def test_annotations_are_ignored(judge):
    check(judge, {"type": "string", "title": "T", "description": "d", "default": "x", "examples": ["y"],
                  "$schema": "https://json-schema.org/draft/2020-12/schema", "nullable": True},
          ['"x"'], ["null"])
    check(judge, {"description": "anything"}, ["1", '"a"', "[]", "{}", "null"], ["x"])


def test_grammars_build_a_matcher(judge):
    for schema in (TREE, nested(30), {"type": "object"}, True,
                   {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 1000}
                                                     for i in range(20)}}):
        assert not LLMatcher(judge.tokenizer, grammar(schema), log_level=0).is_error()


# --- property test: random schemas, random valid and invalid documents -----------------------

NAMES = st.sampled_from(["a", "b", "ab", "k", "x y", "é", "q\"", "z"])


@st.composite
def integer_schemas(draw: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    lo = draw(st.none() | st.integers(-1000, 1000))
    hi = draw(st.none() | st.integers(lo if lo is not None else -1000, 2000))
    if lo is not None:
        schema["exclusiveMinimum" if draw(st.booleans()) and (hi is None or hi > lo + 1) else "minimum"] = lo
    if hi is not None:
        schema["maximum"] = hi
    return schema


@st.composite
def string_schemas(draw: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    lo = draw(st.integers(0, 4))
    if draw(st.booleans()):
        schema["minLength"] = lo
    if draw(st.booleans()):
        schema["maxLength"] = draw(st.integers(lo, lo + 6))
    return schema


LEAVES = st.one_of(
    integer_schemas(), string_schemas(),
    st.builds(lambda lo, w: {"type": "number", "minimum": lo, "maximum": lo + w}, st.integers(-50, 50), st.integers(1, 50)),
    st.just({"type": "number"}), st.just({"type": "boolean"}), st.just({"type": "null"}),
    st.lists(st.one_of(st.integers(-5, 5), st.text(max_size=3), st.none()), min_size=1, max_size=4, unique=True)
    .map(lambda values: {"enum": values}),
)


def containers(children: Any) -> Any:
    objects = st.lists(st.tuples(NAMES, children, st.booleans()), min_size=1, max_size=4,
                       unique_by=lambda t: t[0]).flatmap(lambda props: st.builds(
                           lambda closed: {"type": "object", "properties": {n: s for n, s, _ in props},
                                           "required": [n for n, _, r in props if r],
                                           **({"additionalProperties": False} if closed else {})}, st.booleans()))
    arrays = st.tuples(children, st.integers(0, 3), st.integers(0, 3)).map(
        lambda t: {"type": "array", "items": t[0], "minItems": t[1], "maxItems": t[1] + t[2]})
    return objects | arrays


SCHEMAS = st.recursive(LEAVES, containers, max_leaves=8)


def instances(schema: dict[str, Any]) -> Any:
    """Documents valid against one of our generated schemas, keys in the written order."""
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    t = schema["type"]
    if t == "integer":
        lo = schema.get("minimum", schema.get("exclusiveMinimum", -10**6) + 1)
        return st.integers(lo, schema.get("maximum", 10**6))
    if t == "number" and "minimum" in schema:
        lo, hi = schema["minimum"], schema["maximum"]
        return st.integers(lo, hi) | st.integers(lo, hi - 1).map(lambda n: n + 0.25)
    if t == "number":
        return st.floats(allow_nan=False, allow_infinity=False) | st.integers(-10**15, 10**15)
    if t == "string":
        chars = st.characters(blacklist_categories=("Cs", "Cn"))
        return st.text(chars, min_size=schema.get("minLength", 0), max_size=schema.get("maxLength", 8))
    if t == "array":
        return st.lists(instances(schema["items"]), min_size=schema["minItems"], max_size=schema["maxItems"])
    if t == "object":
        return object_instances(schema)
    return st.none() if t == "null" else st.booleans()


def object_instances(schema: dict[str, Any]) -> Any:
    props = schema["properties"]
    present = st.tuples(*(st.just(True) if n in schema["required"] else st.booleans() for n in props))
    values = st.tuples(*(instances(s) for s in props.values()))
    return st.tuples(present, values).map(
        lambda pv: {n: v for n, p, v in zip(props, pv[0], pv[1]) if p})


def mutants(schema: dict[str, Any], doc: Any) -> list[Any]:
    """Documents made invalid by one change: out of range, missing, too long, unknown."""
    out: list[Any] = []
    t = schema.get("type")
    if "enum" in schema:
        out.append("not-in-enum-zz")
    elif t == "integer":
        out += [schema["maximum"] + 1] if "maximum" in schema else []
        out += [schema["minimum"] - 1] if "minimum" in schema else []
        out += [schema["exclusiveMinimum"]] if "exclusiveMinimum" in schema else []
    elif t == "number" and "minimum" in schema:
        out += [schema["maximum"] + 0.5, schema["minimum"] - 1]
    elif t == "string":
        out += [doc + "x" * (schema["maxLength"] - len(doc) + 1)] if "maxLength" in schema else []
        out += [doc[:schema["minLength"] - 1]] if schema.get("minLength") else []
    elif t == "array":
        out += [doc + doc[:1] * (schema["maxItems"] - len(doc) + 1)] if doc else []
        out += [doc[:schema["minItems"] - 1]] if schema["minItems"] else []
        out += [doc[:i] + [m] + doc[i + 1:] for i, item in enumerate(doc[:1]) for m in mutants(schema["items"], item)]
    elif t == "object":
        out += [{k: v for k, v in doc.items() if k != r} for r in schema["required"]]
        out += [{**doc, "zz-unknown": 1}] if schema.get("additionalProperties") is False else []
        out += [{**doc, k: m} for k, v in doc.items() for m in mutants(schema["properties"][k], v)]
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(schema=SCHEMAS, data=st.data())
def test_random_schemas_accept_valid_and_reject_invalid(judge, schema, data):
    g = grammar(schema)
    validator = jsonschema.Draft202012Validator(schema)
    compact = data.draw(st.booleans())
    # llguidance has the model write DEL as \u007f, as it does the C0 controls; the document parses the same.
    dump = lambda doc: json.dumps(doc, ensure_ascii=False, separators=(",", ":") if compact else None).replace(  # noqa: E731
        "\x7f", "\\u007f")
    for doc in data.draw(st.lists(instances(schema), min_size=1, max_size=3)):
        assert validator.is_valid(doc), (schema, doc)
        if not judge.round_trips(dump(doc)):
            continue
        assert judge.accepts(g, dump(doc)), (schema, dump(doc), g)
        for bad in mutants(schema, doc)[:6]:
            if not validator.is_valid(bad):
                assert not judge.accepts(g, dump(bad)), (schema, dump(bad), g)


# --- any JSON at all as a schema: a grammar llguidance builds a matcher for, or a refusal, quickly --------

GARBAGE_KEYS = st.sampled_from(["type", "enum", "const", "$ref", "allOf", "anyOf", "oneOf", "properties", "required",
                                "additionalProperties", "items", "prefixItems", "minItems", "maxItems", "minLength",
                                "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
                                "exclusiveMaximum", "$defs", "$id", "not", "title"])
GARBAGE_SCALARS = (st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats() | st.text(max_size=6)
                   | st.sampled_from(["#", "#/$defs/a", "#/properties/a", "#/anyOf/0", "string", "integer", "object",
                                      "array", "number", "null", "^a+$", "date", "(", "[^a]", "a{2,3}"]))
GARBAGE = st.recursive(GARBAGE_SCALARS, lambda c: st.lists(c, max_size=4)
                       | st.dictionaries(GARBAGE_KEYS | st.text(max_size=3), c, max_size=5), max_leaves=40)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(schema=GARBAGE)
def test_any_json_gives_a_grammar_or_a_refusal(judge, schema):
    started = time.monotonic()
    try:
        g = grammar(schema)
    except (SchemaError, GrammarError) as exc:
        str(exc).encode()  # messages can go into a JSON error body
        return
    finally:
        assert time.monotonic() - started < 1.0
    matcher = LLMatcher(judge.tokenizer, g, log_level=0)
    assert not matcher.is_error(), (schema, matcher.get_error())
