"""GET and DELETE /v1/responses/{id} at the HTTP edge, through the Processor and its response store: the
owner gets the stored response object and can delete it once; another key, an unknown id and a server that
stores nothing all get the same OpenAI-shaped 404."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient

from app.config.app_args import Limits
from app.http.auth import KeyChecker
from app.http.app import build_http_app
from app.http.endpoints import ServerSettings
from app.http.model_cards import ModelCard
from app.openai_responses.store import MemoryResponseStore
from app.generation.caller import Caller
from app.serving.processing import Processor
from tests.support.openapi_spec import assert_valid

KEY_A, KEY_B = "sk-test-a-" + "a" * 22, "sk-test-b-" + "b" * 22
A, B = {"Authorization": f"Bearer {KEY_A}"}, {"Authorization": f"Bearer {KEY_B}"}
RESPONSE = {"id": "resp_1", "object": "response", "created_at": 1, "status": "completed", "model": "m",
            "output": [{"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": "hi", "annotations": []}]}]}


def no_models():
    """The routes under test generate nothing: a Models whose every call fails the test."""
    def fail(*_a, **_k):
        raise AssertionError("no model call expected")
    return SimpleNamespace(generate=fail, run=fail, close=fail)


def client_over(store) -> TestClient:
    processor = Processor([], no_models(), Limits(), response_store=store)
    settings = ServerSettings(keys=KeyChecker((KEY_A.encode(), KEY_B.encode())))
    return TestClient(build_http_app(processor, [ModelCard("m")], settings), raise_server_exceptions=False)


@pytest.fixture
def store():
    s = MemoryResponseStore()
    owner = Caller.with_key(KEY_A.encode()).key_id
    asyncio.run(s.put(owner, "resp_1", {"response": RESPONSE, "conversation": [{"role": "user", "content": "x"}]}))
    return s


def not_found(r, response_id: str) -> None:
    assert r.status_code == 404, r.text
    assert_valid("ErrorResponse", r.json())
    assert r.json()["error"]["code"] == "not_found" and response_id in r.json()["error"]["message"]


def test_owner_gets_it_others_do_not(store):
    with client_over(store) as c:
        r = c.get("/v1/responses/resp_1", headers=A)
        assert r.status_code == 200 and r.json() == RESPONSE
        not_found(c.get("/v1/responses/resp_1", headers=B), "resp_1")
        not_found(c.get("/v1/responses/resp_unknown", headers=A), "resp_unknown")
        assert c.get("/v1/responses/resp_1").status_code == 401


def test_delete_once_then_gone(store):
    with client_over(store) as c:
        not_found(c.delete("/v1/responses/resp_1", headers=B), "resp_1")  # another key cannot delete it
        r = c.delete("/v1/responses/resp_1", headers=A)
        assert r.status_code == 200 and r.json() == {"id": "resp_1", "object": "response", "deleted": True}
        not_found(c.get("/v1/responses/resp_1", headers=A), "resp_1")
        not_found(c.delete("/v1/responses/resp_1", headers=A), "resp_1")


def test_streaming_a_stored_response_is_refused(store):
    with client_over(store) as c:
        r = c.get("/v1/responses/resp_1?stream=true", headers=A)
        assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
        assert c.get("/v1/responses/resp_1?stream=false", headers=A).status_code == 200


def test_no_store_finds_nothing():
    with client_over(None) as c:
        not_found(c.get("/v1/responses/resp_1", headers=A), "resp_1")
        not_found(c.delete("/v1/responses/resp_1", headers=A), "resp_1")


def test_openai_sdk_shapes(store):
    """The official client reads the GET body as its Response type and sends DELETE as it expects."""
    import openai

    with client_over(store) as c:
        sdk = openai.OpenAI(api_key=KEY_A, base_url="http://testserver/v1", max_retries=0, http_client=c)
        got = sdk.responses.retrieve("resp_1")
        assert got.id == "resp_1" and got.output_text == "hi"
        assert sdk.responses.delete("resp_1") is None
        with pytest.raises(openai.NotFoundError):
            sdk.responses.retrieve("resp_1")
