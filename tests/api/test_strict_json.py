"""The one JSON serialiser: strict JSON out (a non-finite float is an error, never `NaN`/`Infinity` on the wire
or in the store), finite numbers only in."""

from __future__ import annotations

import json
import math
import pickle

import pytest

from app.api import strict_json
from app.api.strict_json import NonFiniteNumber
from app.http.json_body import JSONBody
from app.http.sse import encode_event, encode_named_event
from app.openai_responses.store import encode_entry

NON_FINITE = [math.inf, -math.inf, math.nan]


@pytest.mark.parametrize("value", NON_FINITE)
def test_every_writer_refuses_non_finite_floats(value):
    doc = {"type": "response.created", "response": {"tools": [{"parameters": {"default": value}}]}}
    for write in (strict_json.dumps, strict_json.dumps_bytes, encode_event, encode_named_event, encode_entry,
                  lambda d: JSONBody(d)):
        with pytest.raises(ValueError):
            write(doc)


def test_dumps_is_compact_and_keeps_unicode_by_default():
    assert strict_json.dumps({"a": [1, 2.5, "é"]}) == '{"a":[1,2.5,"é"]}'
    assert strict_json.dumps_bytes({"a": "é"}) == '{"a":"é"}'.encode()
    # As json.dumps spaces it, for text a model reads.
    assert strict_json.dumps({"a": 1, "b": "é"}, compact=False, ensure_ascii=True) == json.dumps({"a": 1, "b": "é"})
    assert strict_json.dumps({"b": 1, "a": 2}, compact=False, indent=2, sort_keys=True) == \
        json.dumps({"b": 1, "a": 2}, indent=2, sort_keys=True)


def test_a_body_says_finite_numbers_out():
    assert JSONBody({"x": 1e308, "y": -0.0}).body == b'{"x":1e+308,"y":-0.0}'


@pytest.mark.parametrize("text", ["1e999", "-1e999", "NaN", "Infinity", "-Infinity", "[1, 2e400]",
                                  '{"default": 1' + "0" * 400 + '.5}'])
def test_loads_refuses_non_finite_numbers(text):
    with pytest.raises(NonFiniteNumber) as err:
        strict_json.loads(text)
    assert isinstance(err.value, json.JSONDecodeError)  # callers that read unparsable JSON as text still do
    assert "not finite" in str(err.value) and len(str(err.value)) < 200


def test_loads_reads_finite_numbers_as_json_does():
    text = '{"a": 1e308, "b": -2.5e-320, "c": 12345678901234567890123, "d": [0.1]}'
    assert strict_json.loads(text) == json.loads(text)
    assert strict_json.loads(b'{"a": 1}') == {"a": 1}


def test_the_error_survives_pickling():
    err = pickle.loads(pickle.dumps(NonFiniteNumber("1e999")))
    assert isinstance(err, NonFiniteNumber) and "1e999" in str(err)


def test_the_shared_wire_encoder_refuses_what_json_refuses_on_every_call():
    # The compact writer keeps one encoder for all calls: a refused value leaves it as it was.
    for _ in range(2):
        with pytest.raises(ValueError):
            strict_json.dumps_bytes({"a": [{"b": float("nan")}]})
        with pytest.raises(TypeError):
            strict_json.dumps({"a": object()})
        assert strict_json.dumps_bytes({"a": [1, None, True]}) == b'{"a":[1,null,true]}'
