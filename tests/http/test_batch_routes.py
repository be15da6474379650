"""The batch routes at the HTTP edge, through the Processor and a store in a temporary folder, with the official
`openai` and `anthropic` SDKs (their httpx client is the app's test client): files uploaded as multipart and
streamed back, batches made, read, listed and cancelled, Message Batches made from their JSON body; every body
valid against OpenAI's spec; another key's ids are 404s; uploads and bodies past their limits, malformed forms and
bodies, and web pages are refused, and a refused upload leaves nothing in the store."""

from __future__ import annotations

import json
from types import SimpleNamespace

import anthropic
import openai
import pytest
from starlette.testclient import TestClient

from app.batches.service import BatchService
from app.batches.store import BatchStore
from app.config.app_args import BatchConfig, Limits
from app.http.app import build_http_app
from app.http.auth import KeyChecker
from app.http.batch_routes import BatchEdge
from app.http.endpoints import ServerSettings
from app.http.model_cards import ModelCard
from app.serving.processing import Processor
from tests.support import anthropic_spec
from tests.support.openapi_spec import assert_valid

KEY_A, KEY_B = "sk-test-a-" + "a" * 22, "sk-test-b-" + "b" * 22
A, B = {"Authorization": f"Bearer {KEY_A}"}, {"Authorization": f"Bearer {KEY_B}"}
LINE = {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}
DATA = (json.dumps(LINE) + "\n").encode()


def no_models():
    def fail(*_a, **_k):
        raise AssertionError("no model call expected")
    return SimpleNamespace(generate=fail, run=fail, close=fail)


@pytest.fixture
def store(tmp_path) -> BatchStore:
    return BatchStore(str(tmp_path / "batches"))


def client_over(store: BatchStore, config: BatchConfig | None = None, keys: bool = True) -> TestClient:
    config = config or BatchConfig()
    processor = Processor([], no_models(), Limits(), batches=BatchService(store, config))
    settings = ServerSettings(keys=KeyChecker((KEY_A.encode(), KEY_B.encode()) if keys else ()))
    app = build_http_app(processor, [ModelCard("m")], settings, batches=BatchEdge(store, config, 1 << 20))
    return TestClient(app, raise_server_exceptions=False)


def sdk(client: TestClient, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key=key, http_client=client, max_retries=0)


def stored_files(store: BatchStore) -> list[str]:
    return [p for p in store.fs.find(store.root) if "/files/" in p]


def test_the_sdk_file_workflow_and_another_key_sees_nothing(store):
    with client_over(store) as c:
        client = sdk(c)
        file = client.files.create(file=("in.jsonl", DATA), purpose="batch")
        assert_valid("OpenAIFile", file.model_dump(exclude_unset=True))
        assert (file.bytes, file.filename, file.purpose) == (len(DATA), "in.jsonl", "batch")
        assert client.files.retrieve(file.id).id == file.id
        listed = c.get("/v1/files", headers=A).json()
        assert_valid("ListFilesResponse", listed)
        assert [f["id"] for f in listed["data"]] == [file.id]
        assert client.files.content(file.id).content == DATA
        other = sdk(c, KEY_B)
        for call in (lambda: other.files.retrieve(file.id), lambda: other.files.content(file.id),
                     lambda: other.files.delete(file.id)):
            with pytest.raises(openai.NotFoundError):
                call()
        assert c.get("/v1/files", headers=B).json()["data"] == []
        deleted = client.files.delete(file.id)
        assert_valid("DeleteFileResponse", deleted.model_dump())
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(file.id)
        assert stored_files(store) == []


def test_the_sdk_batch_workflow_up_to_a_cancel(store):
    with client_over(store) as c:
        client = sdk(c)
        file = client.files.create(file=("in.jsonl", DATA), purpose="batch")
        batches = [client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                         completion_window="24h", metadata={"run": str(i)}) for i in range(3)]
        for batch in batches:
            assert_valid("Batch", batch.model_dump(exclude_unset=True))
            assert batch.status == "validating" and batch.input_file_id == file.id
        page = c.get("/v1/batches", params={"limit": 2}, headers=A).json()
        assert_valid("ListBatchesResponse", page)
        assert [b["id"] for b in page["data"]] == [batches[2].id, batches[1].id] and page["has_more"]
        rest = c.get("/v1/batches", params={"after": page["last_id"]}, headers=A).json()
        assert [b["id"] for b in rest["data"]] == [batches[0].id] and not rest["has_more"]
        assert [b.id for b in client.batches.list()] == [b.id for b in reversed(batches)]  # the SDK's pager
        cancelled = client.batches.cancel(batches[0].id)
        assert cancelled.status == "cancelling" and cancelled.cancelling_at
        assert client.batches.retrieve(batches[0].id).status == "cancelling"
        with pytest.raises(openai.ConflictError):  # its input is in use
            client.files.delete(file.id)
        other = sdk(c, KEY_B)
        with pytest.raises(openai.NotFoundError):
            other.batches.retrieve(batches[1].id)
        with pytest.raises(openai.NotFoundError):
            other.batches.cancel(batches[1].id)
        with pytest.raises(openai.NotFoundError):  # another key's file is no file to it
            other.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
        assert c.get("/v1/batches", headers=B).json()["data"] == []


@pytest.mark.parametrize("body, param", [
    ({"endpoint": "/v1/moderations", "completion_window": "24h"}, "endpoint"),
    ({"endpoint": "/v1/chat/completions", "completion_window": "1h"}, "completion_window"),
    ({"endpoint": "/v1/chat/completions", "completion_window": "24h", "metadata": {"k": 1}}, "metadata.k"),
    ({"endpoint": "/v1/chat/completions", "completion_window": "24h", "input_file_id": "file-nope"},
     "input_file_id"),
])
def test_a_batch_that_cannot_be_made_is_refused_naming_the_field(store, body, param):
    with client_over(store) as c:
        file = sdk(c).files.create(file=("in.jsonl", DATA), purpose="batch")
        r = c.post("/v1/batches", json={"input_file_id": file.id, **body}, headers=A)
        assert r.status_code in (400, 404), r.text
        assert_valid("ErrorResponse", r.json())
        assert r.json()["error"]["param"] == param


def test_a_key_has_a_cap_on_open_batches_and_on_files(store):
    with client_over(store, BatchConfig(max_open_batches_per_key=2, max_files_per_key=2)) as c:
        client = sdk(c)
        file = client.files.create(file=("in.jsonl", DATA), purpose="batch")
        for _ in range(2):
            client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
        with pytest.raises(openai.RateLimitError) as refused:
            client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
        assert refused.value.code == "too_many_open_batches"
        client.files.create(file=("b.jsonl", DATA), purpose="batch")
        with pytest.raises(openai.RateLimitError):
            client.files.create(file=("c.jsonl", DATA), purpose="batch")
        # Another key has a share of its own.
        sdk(c, KEY_B).batches.create(input_file_id=sdk(c, KEY_B).files.create(file=("x", DATA), purpose="batch").id,
                                     endpoint="/v1/chat/completions", completion_window="24h")


def test_uploads_past_the_limit_or_malformed_are_refused_and_leave_nothing(store):
    with client_over(store, BatchConfig(max_file_bytes=4096)) as c:
        client = sdk(c)
        with pytest.raises(openai.APIStatusError) as too_large:
            client.files.create(file=("big.jsonl", b"x" * 100_000), purpose="batch")
        assert too_large.value.status_code == 413
        with pytest.raises(openai.BadRequestError) as purpose:
            client.files.create(file=("in.jsonl", DATA), purpose="fine-tune")
        assert purpose.value.body["param"] == "purpose"
        r = c.post("/v1/files", data={"purpose": "batch"}, files={"other": ("x", b"1")}, headers=A)
        assert r.status_code == 400 and r.json()["error"]["param"] == "file"
        r = c.post("/v1/files", content=b"--x\r\nbroken", headers={**A, "Content-Type": "multipart/form-data; "
                                                                               "boundary=x"})
        assert r.status_code == 400
        r = c.post("/v1/files", json={"purpose": "batch"}, headers=A)
        assert r.status_code == 400
        two = [("file", ("a", b"1")), ("file", ("b", b"2"))]
        assert c.post("/v1/files", data={"purpose": "batch"}, files=two, headers=A).status_code == 400
        # A streamed body (no Content-Length) past the limit is cut as it comes.
        def chunks():
            yield b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\n"
            for _ in range(10):
                yield b"y" * 1024
        r = c.post("/v1/files", content=chunks(), headers={**A, "Content-Type": "multipart/form-data; boundary=b"})
        assert r.status_code == 413
        assert stored_files(store) == []


def test_a_web_page_cannot_upload_to_a_keyless_server(store):
    with client_over(store, keys=False) as c:
        r = c.post("/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", DATA)},
                   headers={"Origin": "https://evil.example"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
        assert stored_files(store) == []
        ok = c.post("/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", DATA)})
        assert ok.status_code == 200, ok.text


def message_batch_body(n: int = 2) -> dict:
    return {"requests": [{"custom_id": f"req-{i}", "params": {"model": "m", "max_tokens": 5,
                                                             "messages": [{"role": "user", "content": f"q{i}"}]}}
                         for i in range(n)]}


def test_the_anthropic_sdk_makes_reads_lists_and_cancels_a_message_batch(store):
    with client_over(store) as c:
        client = anthropic.Anthropic(base_url="http://testserver", api_key=KEY_A, http_client=c, max_retries=0)
        batch = client.messages.batches.create(requests=message_batch_body()["requests"])
        assert batch.processing_status == "in_progress" and batch.request_counts.processing == 2
        assert client.messages.batches.retrieve(batch.id).id == batch.id
        assert [b.id for b in client.messages.batches.list()] == [batch.id]
        anthropic_spec.assert_valid("MessageBatch", c.get(f"/v1/messages/batches/{batch.id}", headers=A).json())
        anthropic_spec.assert_valid("ListResponse_MessageBatch_", c.get("/v1/messages/batches", headers=A).json())
        with pytest.raises(anthropic.AnthropicError):  # not ended: no results_url yet
            list(client.messages.batches.results(batch.id))
        early = c.get(f"/v1/messages/batches/{batch.id}/results", headers=A)
        assert early.status_code == 404 and early.json()["type"] == "error"
        with pytest.raises(anthropic.BadRequestError):  # not ended: cannot be deleted
            client.messages.batches.delete(batch.id)
        assert client.messages.batches.cancel(batch.id).processing_status == "canceling"
        other = anthropic.Anthropic(base_url="http://testserver", api_key=KEY_B, http_client=c, max_retries=0)
        with pytest.raises(anthropic.NotFoundError):
            other.messages.batches.retrieve(batch.id)
        lines = store.get(f"keys/{batch_owner(store)}/batches/{batch.id}/input.jsonl").splitlines()
        assert [json.loads(line)["custom_id"] for line in lines] == ["req-0", "req-1"]


def batch_owner(store: BatchStore) -> str:
    return store.names("keys")[0]


@pytest.mark.parametrize("body, where", [
    ({"requests": [{"custom_id": "a", "params": {}}, {"custom_id": "a", "params": {}}]}, "requests[1].custom_id"),
    ({"requests": [{"custom_id": "no spaces", "params": {}}]}, "requests[0].custom_id"),
    ({"requests": [{"custom_id": "a", "params": []}]}, "requests[0].params"),
    ({"requests": [{"custom_id": "a", "params": {}, "extra": 1}]}, "requests[0]"),
    ({"requests": [1]}, "requests[0]"),
    ({"requests": []}, "requests"),
    ({"other": []}, "requests"),
])
def test_a_malformed_message_batch_is_refused_in_anthropics_shape(store, body, where):
    with client_over(store) as c:
        r = c.post("/v1/messages/batches", json=body, headers=A)
        assert r.status_code == 400, r.text
        anthropic_spec.assert_valid_error(r.json())
        assert r.json()["error"]["type"] == "invalid_request_error"
        assert where.split(".")[0].split("[")[0] in r.json()["error"]["message"] or where in r.json()["error"][
            "message"]
        assert store.names("keys") == [] or not store.fs.find(store.root + "/keys")


def test_a_message_batch_body_past_its_limits_is_refused(store):
    config = BatchConfig(max_file_bytes=4096, max_lines=3)
    with client_over(store, config) as c:
        r = c.post("/v1/messages/batches", json=message_batch_body(4), headers=A)
        assert r.status_code == 400 and "at most 3" in r.json()["error"]["message"]
        r = c.post("/v1/messages/batches", content=b'{"requests": [' + b" " * 8000 + b"]}",
                   headers={**A, "Content-Type": "application/json"})
        assert r.status_code == 413
        r = c.post("/v1/messages/batches", content=b"{}", headers={**A, "Content-Type": "text/plain"})
        assert r.status_code == 415
        assert not store.fs.find(store.root + "/keys")


def test_batch_routes_answer_404_when_batch_jobs_are_off():
    processor = Processor([], no_models(), Limits())
    app = build_http_app(processor, [ModelCard("m")], ServerSettings(keys=KeyChecker((KEY_A.encode(),))))
    with TestClient(app, raise_server_exceptions=False) as c:
        assert c.get("/v1/batches", headers=A).status_code == 404
        assert c.post("/v1/files", files={"file": ("a", b"1")}, data={"purpose": "batch"},
                      headers=A).status_code == 404
