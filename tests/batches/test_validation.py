"""A batch's input checked before anything runs (app/batches/lines.py, validation.py): lines read in bounded
blocks whatever their split, a line past its limit reported without being held, and each refusal naming its line
(OpenAI refuses the whole batch for one); the plan orders lines by their prompt's prefix."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.batches.endpoints import ENDPOINTS, MESSAGES
from app.batches.lines import raw_lines
from app.batches.validation import LineCheck, Plan, prefix_key, validate
from app.tenants.policies import KeyPolicy, key_hash
from tests.batches.conftest import CHAT, EMBED, MODELS, chat_line, jsonl

CHAT_URL = ENDPOINTS["/v1/chat/completions"]


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=8),
       st.lists(st.integers(min_value=0, max_value=10_000), max_size=6), st.booleans())
def test_lines_are_the_same_whatever_the_blocks(lines, cuts, final_newline):
    data = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    read = list(raw_lines(split(data, cuts), max_line_bytes=1 << 20))
    expected = data.split(b"\n")
    if data.endswith(b"\n") or not data:
        expected = expected[:-1]
    assert [r.data for r in read] == [
        e[:-1] if e.endswith(b"\r") else e for e in expected]
    for r in read:  # each line's offset and length find it in the file
        assert data[r.offset:r.offset + r.length].removesuffix(b"\r") == r.data


def test_a_line_past_its_limit_is_reported_by_number_and_never_held():
    huge = b"x" * (5 << 20)
    blocks = [b'{"a":1}\n', *(huge[i:i + 65536] for i in range(0, len(huge), 65536)), b"\n", b'{"b":2}\n']
    read = list(raw_lines(blocks, max_line_bytes=1024))
    assert [(r.number, r.data) for r in read] == [(1, b'{"a":1}'), (2, None), (3, b'{"b":2}')]
    assert read[1].length == len(huge) and read[2].offset == 8 + len(huge) + 1


def check(policy: KeyPolicy | None = None, endpoint=CHAT_URL) -> LineCheck:
    return LineCheck(endpoint, MODELS, policy)


def plan_of(data: bytes, **kwargs) -> Plan:
    return validate([data], kwargs.pop("check", check()), max_lines=kwargs.pop("max_lines", 100),
                    max_line_bytes=kwargs.pop("max_line_bytes", 1 << 20), **kwargs)


def test_a_good_file_is_planned_line_by_line():
    plan = plan_of(jsonl([chat_line("a"), chat_line("b", "other")]) + b"\n\n")
    assert plan.total == 2 and not plan.errors
    assert [(p.line, p.model) for p in plan.lines] == [(1, CHAT), (2, CHAT)]
    assert Plan.from_json(plan.to_json()) == plan


OTHER_KEY = KeyPolicy(name="other", key_sha256=key_hash("k"), models=(EMBED,))


@pytest.mark.parametrize("line, code, param", [
    (b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": ', "invalid_json_line", None),
    (b"\xff\xfe not utf-8", "invalid_json_line", None),
    (b"[1, 2]", "invalid_json_line", None),
    (b'{"custom_id": NaN}', "invalid_json_line", None),
    (b'{"a": ' + b"[" * 100 + b"]" * 100 + b"}", "invalid_json_line", None),
    (json.dumps({**chat_line("x"), "custom_id": ""}).encode(), "invalid_request", "custom_id"),
    (json.dumps({**chat_line("x"), "method": "GET"}).encode(), "invalid_request", "method"),
    (json.dumps({**chat_line("x"), "url": "/v1/embeddings"}).encode(), "mismatched_endpoint", "url"),
    (json.dumps({**chat_line("x"), "body": "text"}).encode(), "invalid_request", "body"),
    (json.dumps(chat_line("x", stream=True)).encode(), "invalid_request", "body.stream"),
    (json.dumps(chat_line("x", temperature="hot")).encode(), "invalid_value", "body.temperature"),
    (json.dumps(chat_line("x", model="nope")).encode(), "model_not_found", "body.model"),
    (json.dumps(chat_line("x", model=EMBED)).encode(), "unsupported_model", "body.model"),
])
def test_each_refused_line_is_named(line, code, param):
    plan = plan_of(jsonl([chat_line("a"), line, chat_line("c")]))
    assert [(e.line, e.code, e.param) for e in plan.errors] == [(2, code, param)]
    assert plan.errors[0].message.startswith("Line 2")
    assert [p.line for p in plan.lines] == [1, 3]


def test_duplicate_custom_ids_too_long_lines_and_too_many_lines():
    plan = plan_of(jsonl([chat_line("a"), chat_line("a")]))
    assert [(e.line, e.code) for e in plan.errors] == [(2, "duplicate_custom_id")]
    plan = plan_of(jsonl([chat_line("a"), chat_line("b", "x" * 5000)]), max_line_bytes=2048)
    assert [(e.line, e.code) for e in plan.errors] == [(2, "line_too_long")]
    plan = plan_of(jsonl([chat_line(str(i)) for i in range(5)]), max_lines=3)
    assert [(e.line, e.code) for e in plan.errors] == [(4, "too_many_requests")]
    assert [(e.line, e.code) for e in plan_of(b"\n \n").errors] == [(1, "empty_file")]


def test_a_model_the_key_may_not_use_is_refused_as_unknown():
    plan = plan_of(jsonl([chat_line("a")]), check=check(OTHER_KEY))
    assert [(e.line, e.code, e.status) for e in plan.errors] == [(1, "model_not_found", 404)]


def test_embeddings_lines_need_an_embedding_model():
    line = {"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"model": EMBED, "input": "hi"}}
    plan = plan_of(jsonl([line]), check=check(endpoint=ENDPOINTS["/v1/embeddings"]))
    assert not plan.errors and plan.lines[0].model == EMBED


def test_message_batch_lines_are_read_as_messages_requests():
    good = {"custom_id": "m", "method": "POST", "url": "/v1/messages",
            "body": {"model": CHAT, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}}
    bad = {**good, "custom_id": "n", "body": {"model": CHAT, "messages": []}}
    plan = plan_of(jsonl([good, bad]), check=check(endpoint=MESSAGES))
    assert [p.line for p in plan.lines] == [1]
    assert [(e.line, e.custom_id) for e in plan.errors] == [(2, "n")]


def test_lines_are_ordered_by_their_prompt_prefix():
    lines = [chat_line("a", "q1", system="A"), chat_line("b", "q2", system="B"), chat_line("c", "q3", system="A"),
             chat_line("d", "q4", system="B")]
    order = [p.line for p in plan_of(jsonl(lines)).order()]
    assert {tuple(order[:2]), tuple(order[2:])} == {(1, 3), (2, 4)}
    body = chat_line("x", system="A")["body"]
    assert prefix_key(CHAT_URL, CHAT, body) == prefix_key(CHAT_URL, CHAT, {**body, "max_tokens": 9})
    assert prefix_key(CHAT_URL, CHAT, body) != prefix_key(CHAT_URL, "other", body)
