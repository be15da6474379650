"""Batch jobs on the shared clusters, in both topologies, through the official SDKs: OpenAI's Files and Batches
workflow for each endpoint (every output body valid against OpenAI's spec, each custom_id answered once), a
Message Batch with the `anthropic` SDK (a request that fails its checks answered `errored`, the rest run), a
malformed file refused naming its line, another key's batch a 404, a cancel that stops within seconds and keeps
the lines answered, and the key's usage counting batch lines as such. Lines are short (`max_tokens` small)."""

from __future__ import annotations

import io
import json
import time
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support import anthropic_spec
from tests.support.openapi_spec import assert_valid
from tests.support.serve_harness import EMBED_MODEL, KEY_A, KEY_B, MODEL, TENANT_KEYS

pytestmark = pytest.mark.timeout(600)

ENDED = ("completed", "failed", "expired", "cancelled")


def chat_line(custom_id: str, content: str, system: str = "Answer in one word.", max_tokens: int = 4) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "max_tokens": max_tokens, "temperature": 0,
                     "messages": [{"role": "system", "content": system}, {"role": "user", "content": content}]}}


def upload(client: openai.OpenAI, lines: list[Any]) -> str:
    data = b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines)
    return client.files.create(file=("batch.jsonl", io.BytesIO(data)), purpose="batch").id


def wait_ended(client: openai.OpenAI, batch_id: str, timeout: float = 240.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ENDED:
            return batch
        assert time.monotonic() < deadline, f"batch {batch_id} still {batch.status}: {batch.request_counts}"
        time.sleep(0.3)


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).content.splitlines()]


def run(client: openai.OpenAI, endpoint: str, lines: list[Any]) -> tuple[Any, list[dict], list[dict]]:
    batch = client.batches.create(input_file_id=upload(client, lines), endpoint=endpoint, completion_window="24h")
    assert_valid("Batch", batch.model_dump(exclude_unset=True))
    batch = wait_ended(client, batch.id)
    assert_valid("Batch", batch.model_dump(exclude_unset=True))
    return batch, lines_of(client, batch.output_file_id), lines_of(client, batch.error_file_id)


def test_the_openai_sdk_runs_a_batch_of_each_endpoint(client):
    jobs = {
        "/v1/chat/completions": ([chat_line(f"chat-{i}", f"Name a colour {i}.") for i in range(3)],
                                 "CreateChatCompletionResponse"),
        "/v1/completions": ([{"custom_id": f"cmpl-{i}", "method": "POST", "url": "/v1/completions",
                              "body": {"model": MODEL, "prompt": f"One, two, {i}", "max_tokens": 3}}
                             for i in range(2)], "CreateCompletionResponse"),
        "/v1/embeddings": ([{"custom_id": f"emb-{i}", "method": "POST", "url": "/v1/embeddings",
                             "body": {"model": EMBED_MODEL, "input": f"text {i}"}} for i in range(2)],
                           "CreateEmbeddingResponse"),
        "/v1/responses": ([{"custom_id": f"resp-{i}", "method": "POST", "url": "/v1/responses",
                            "body": {"model": MODEL, "input": f"Say {i}.", "max_output_tokens": 4, "store": False}}
                           for i in range(2)], "Response"),
    }
    made = {endpoint: client.batches.create(input_file_id=upload(client, lines), endpoint=endpoint,
                                            completion_window="24h") for endpoint, (lines, _) in jobs.items()}
    for endpoint, (lines, schema) in jobs.items():
        batch = wait_ended(client, made[endpoint].id)
        assert batch.status == "completed", (endpoint, batch)
        assert batch.request_counts.total == len(lines) and batch.request_counts.completed == len(lines)
        output = lines_of(client, batch.output_file_id)
        assert sorted(o["custom_id"] for o in output) == sorted(line["custom_id"] for line in lines)
        for out in output:
            assert out["error"] is None and out["response"]["status_code"] == 200
            assert_valid(schema, out["response"]["body"])
        assert batch.error_file_id is None


def test_a_malformed_file_fails_the_batch_naming_its_line(client):
    lines = [chat_line("ok", "hi"), b'{"custom_id": "broken", "method": "POST"', chat_line("ok", "again")]
    batch, output, errors = run(client, "/v1/chat/completions", lines)
    assert batch.status == "failed" and not output and not errors
    assert [(e.line, e.code) for e in batch.errors.data] == [(2, "invalid_json_line"), (3, "duplicate_custom_id")]


def test_a_line_the_model_refuses_goes_to_the_error_file_and_the_others_run(client):
    lines = [chat_line("good", "hi"), chat_line("too-long", "hi", max_tokens=10_000)]
    batch, output, errors = run(client, "/v1/chat/completions", lines)
    assert batch.status == "completed"
    assert [o["custom_id"] for o in output] == ["good"]
    assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [("too-long", 400)]
    assert_valid("ErrorResponse", errors[0]["response"]["body"])


def test_another_keys_batch_and_files_are_404s(client, cluster):
    batch = client.batches.create(input_file_id=upload(client, [chat_line("a", "hi")]),
                                  endpoint="/v1/chat/completions", completion_window="24h")
    other = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=KEY_B, max_retries=0, timeout=60)
    for call in (lambda: other.batches.retrieve(batch.id), lambda: other.batches.cancel(batch.id),
                 lambda: other.files.retrieve(batch.input_file_id),
                 lambda: other.files.content(batch.input_file_id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert batch.id not in {b.id for b in other.batches.list()}
    wait_ended(client, batch.id)


def test_a_cancel_stops_within_seconds_and_keeps_the_answered_lines(client, cluster):
    lines = [chat_line(f"long-{i}", f"Write a long story about the number {i}.", max_tokens=32) for i in range(12)]
    batch = client.batches.create(input_file_id=upload(client, lines), endpoint="/v1/chat/completions",
                                  completion_window="24h")
    deadline = time.monotonic() + 240
    while client.batches.retrieve(batch.id).request_counts.completed < 1:
        assert time.monotonic() < deadline, "no line answered"
        time.sleep(0.2)
    asked = time.monotonic()
    assert client.batches.cancel(batch.id).status == "cancelling"
    batch = wait_ended(client, batch.id, timeout=60)
    assert time.monotonic() - asked < 15
    assert batch.status == "cancelled"
    output, errors = lines_of(client, batch.output_file_id), lines_of(client, batch.error_file_id)
    answered = [o["custom_id"] for o in output]
    assert answered and all(o["response"]["status_code"] == 200 for o in output)
    assert {e["error"]["code"] for e in errors} <= {"batch_cancelled"}
    # Every line once, in one of the two files.
    assert sorted(answered + [e["custom_id"] for e in errors]) == sorted(line["custom_id"] for line in lines)
    # The lines that were running stopped where they ran: the model's slots are free again.
    deadline = time.monotonic() + 15
    while cluster.model_stats(MODEL)["batch_running"]:
        assert time.monotonic() < deadline, cluster.model_stats(MODEL)
        time.sleep(0.2)


def test_the_anthropic_sdk_runs_a_message_batch(cluster):
    client = anthropic.Anthropic(base_url=cluster.url, api_key=KEY_A, max_retries=0, timeout=60)
    requests = [{"custom_id": f"msg-{i}", "params": {"model": MODEL, "max_tokens": 4,
                                                     "messages": [{"role": "user", "content": f"Hi {i}"}]}}
                for i in range(2)]
    requests.append({"custom_id": "bad", "params": {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}})
    batch = client.messages.batches.create(requests=requests)
    assert batch.processing_status == "in_progress" and batch.request_counts.processing == 3
    deadline = time.monotonic() + 240
    while (batch := client.messages.batches.retrieve(batch.id)).processing_status != "ended":
        assert time.monotonic() < deadline, batch
        time.sleep(0.3)
    assert batch.request_counts.succeeded == 2 and batch.request_counts.errored == 1
    raw = httpx.get(f"{cluster.url}/v1/messages/batches/{batch.id}/results", headers={"x-api-key": KEY_A}, timeout=60)
    for line in raw.text.splitlines():
        anthropic_spec.assert_valid("MessageBatchIndividualResponse", json.loads(line))
    anthropic_spec.assert_valid("MessageBatch", httpx.get(f"{cluster.url}/v1/messages/batches/{batch.id}",
                                                          headers={"x-api-key": KEY_A}, timeout=60).json())
    results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    assert set(results) == {"msg-0", "msg-1", "bad"}
    assert results["msg-0"].type == "succeeded" and results["msg-0"].message.role == "assistant"
    assert results["bad"].type == "errored" and results["bad"].error.error.type == "invalid_request_error"
    deleted = httpx.delete(f"{cluster.url}/v1/messages/batches/{batch.id}", headers={"x-api-key": KEY_A}, timeout=60)
    anthropic_spec.assert_valid("DeleteMessageBatchResponse", deleted.json())
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(batch.id)


def test_the_keys_usage_counts_batch_lines_as_such(cluster):
    # A key with limits: its usage is settled as each line ends (an unlimited key's goes to the ledger in batches).
    key = TENANT_KEYS["paced"][0]
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=key, max_retries=0, timeout=60)
    batch, output, _ = run(client, "/v1/chat/completions", [chat_line("u1", "hi"), chat_line("u2", "yo")])
    assert batch.status == "completed" and len(output) == 2
    usage = httpx.get(f"{cluster.url}/v1/usage", headers={"Authorization": f"Bearer {key}"}, timeout=30).json()
    counts = usage["keys"]["paced"]["models"][MODEL]
    assert counts["batch_requests"] >= 2 and counts["requests"] >= counts["batch_requests"]
    assert counts["batch_tokens"] > 0
