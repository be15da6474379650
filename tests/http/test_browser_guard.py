"""A web page as the attacker (app/http/browser_guard.py), over the Starlette app with a fake processing: a
rebound name (DNS rebinding) reaches no keyless route, a foreign Origin no route at all, a body a page can
send without a preflight (text/plain, a form) is a 415 in the route's protocol shape; loopback and configured
hosts and origins, and clients that send no Origin, are served as before."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from starlette.testclient import TestClient

from app.anthropic_messages.schemas import CountTokensRequest
from app.api.schemas import TokenizeRequest
from app.config.app_args import AuthConfig
from app.http.auth import KeyChecker
from app.http.browser_guard import BrowserPolicy, browser_policy, entries, normal_origin, split_host
from app.http.app import build_http_app
from app.http.endpoints import ServerSettings
from app.http.model_cards import ModelCard

KEY = "sk-test-" + "k" * 24
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
LOCAL = "http://localhost:8000"
REBOUND = "evil.example:8000"
EVIL = "https://evil.example"


class Backend:
    """Records what reaches the processing: a refused request must not."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    async def respond(self, request, caller) -> dict[str, Any]:
        self.seen.append(request)
        if isinstance(request, TokenizeRequest):
            return {"tokens": [], "count": 0, "max_model_len": 8}
        if isinstance(request, CountTokensRequest):
            return {"input_tokens": 1}
        return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "choices": [],
                "usage": {"prompt_tokens": 1, "completion_tokens": 0, "total_tokens": 1}}


@pytest.fixture
def backend() -> Backend:
    return Backend()


def client_of(backend: Backend, *, keyless: bool = True, hosts=(), origins=()) -> TestClient:
    settings = ServerSettings(keys=KeyChecker(() if keyless else (KEY.encode(),)),
                              browser=browser_policy(keyless, hosts, origins))
    return TestClient(build_http_app(backend, [ModelCard("m")], settings), base_url=LOCAL)


def refused(resp, status: int, code: str) -> None:
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["code"] == code, resp.json()
    assert "access-control-allow-origin" not in resp.headers


def test_a_rebound_host_reaches_no_route_of_a_keyless_server(backend):
    with client_of(backend) as c:
        refused(c.post("/v1/chat/completions", json=CHAT, headers={"Host": REBOUND}), 403, "host_not_allowed")
        # A GET the page makes same-origin after rebinding carries no Origin: the Host alone refuses it.
        refused(c.get("/v1/models", headers={"Host": REBOUND}), 403, "host_not_allowed")
        refused(c.get("/v1/usage", headers={"Host": REBOUND}), 403, "host_not_allowed")
        refused(c.get("/health", headers={"Host": REBOUND}), 403, "host_not_allowed")
        r = c.post("/v1/messages/count_tokens", headers={"Host": REBOUND},
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"  # Anthropic's shape
    assert backend.seen == []


@pytest.mark.parametrize("host", ["localhost:8000", "localhost", "127.0.0.1:8000", "127.3.4.5:1", "[::1]:8000",
                                  "[::1]", "LOCALHOST.:8000", "app.localhost:8000", "10.1.2.3:8000",
                                  "[fd00::5]:8000"])
def test_loopback_names_and_addresses_are_served(backend, host):
    # An address cannot be rebound: a page whose URL is an address is served by whoever owns it.
    with client_of(backend) as c:
        assert c.post("/v1/chat/completions", json=CHAT, headers={"Host": host}).status_code == 200
    assert len(backend.seen) == 1


@pytest.mark.parametrize("host", ["evil.example", "localhost.evil.example:8000", "127.0.0.1.nip.io:8000",
                                  "2130706433:8000", "::1", "a b", "llm.internal:9000"])
def test_other_names_are_refused_without_keys(backend, host):
    with client_of(backend, hosts=["llm.internal:8000"]) as c:
        refused(c.post("/v1/chat/completions", json=CHAT, headers={"Host": host}), 403, "host_not_allowed")
    assert backend.seen == []


@pytest.mark.parametrize(("entry", "host"), [("llm.internal", "llm.internal:8000"), ("llm.internal:8000", "llm.internal:8000"),
                                             ("LLM.internal", "llm.INTERNAL"), (".corp.example", "llm.corp.example"),
                                             (".corp.example", "corp.example:443"), ("*", "anything.example")])
def test_a_configured_extra_host_is_served(backend, entry, host):
    with client_of(backend, hosts=[entry]) as c:
        assert c.post("/v1/chat/completions", json=CHAT, headers={"Host": host}).status_code == 200


def test_with_keys_the_host_is_not_checked_the_key_is(backend):
    # A page cannot send a key without a preflight, which a foreign Origin never passes: keys are the guard.
    with client_of(backend, keyless=False) as c:
        assert c.post("/v1/chat/completions", json=CHAT, headers={"Host": REBOUND}).status_code == 401
        assert c.post("/v1/chat/completions", json=CHAT,
                      headers={"Host": "llm.company.example", "Authorization": f"Bearer {KEY}"}).status_code == 200


@pytest.mark.parametrize("keyless", [True, False])
@pytest.mark.parametrize("origin", [EVIL, "null", "http://localhost.evil.example", "file://", "http://10.0.0.5:3000",
                                    "http://localhost:8000/path"])
def test_a_foreign_origin_is_refused_on_every_route(backend, keyless, origin):
    auth = {} if keyless else {"Authorization": f"Bearer {KEY}"}
    with client_of(backend, keyless=keyless) as c:
        # The simple POST a page sends with mode "no-cors": text/plain, no preflight.
        refused(c.post("/v1/chat/completions", content=b'{"model": "m", "messages": []}',
                       headers={"Origin": origin, "Content-Type": "text/plain", **auth}), 403, "origin_not_allowed")
        refused(c.post("/v1/chat/completions", json=CHAT, headers={"Origin": origin, **auth}), 403, "origin_not_allowed")
        refused(c.get("/v1/models", headers={"Origin": origin, **auth}), 403, "origin_not_allowed")
        # Every key's usage, on a keyless server: not for a page to read.
        refused(c.get("/v1/usage", headers={"Origin": origin, **auth}), 403, "origin_not_allowed")
        # Its preflight gets no CORS headers either: the browser will not send the real request.
        refused(c.options("/v1/chat/completions", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"}), 403, "origin_not_allowed")
        r = c.post("/v1/messages", json={}, headers={"Origin": origin, **auth})
        assert r.status_code == 403 and r.json()["type"] == "error" and r.json()["error"]["type"] == "permission_error"
    assert backend.seen == []


@pytest.mark.parametrize(("origins", "origin"), [((), "http://localhost:5173"), ((), "http://127.0.0.1:3000"),
                                                 ((), "http://[::1]:8080"), ((), "https://localhost"),
                                                 (("https://app.example.com",), "https://app.example.com"),
                                                 (("https://app.example.com:443",), "https://APP.example.com"),
                                                 (("http://10.0.0.5:3000",), "http://10.0.0.5:3000"),
                                                 (("*",), EVIL)])
def test_an_allowed_origin_gets_through_with_cors_headers_for_itself(backend, origins, origin):
    with client_of(backend, keyless=False, origins=origins) as c:
        # The browser's preflight carries no key: it is answered before the key check.
        pre = c.options("/v1/chat/completions", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert pre.status_code == 200, pre.text
        assert pre.headers["access-control-allow-origin"] == origin  # itself, never `*`
        assert "authorization" in pre.headers["access-control-allow-headers"].lower()
        r = c.post("/v1/chat/completions", json=CHAT, headers={"Origin": origin, "Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
        assert "origin" in r.headers["vary"].lower()
    assert len(backend.seen) == 1


def test_no_origin_gets_through_without_cors_headers(backend):
    with client_of(backend) as c:
        r = c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


@pytest.mark.parametrize("content_type", ["text/plain", "text/plain;charset=UTF-8",
                                          "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                                          "application/xml", "application/jsonx"])
def test_a_body_a_page_sends_without_preflight_is_a_415(backend, content_type):
    # Even from a client with no Origin and a key: what the route accepts is JSON.
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    with client_of(backend, keyless=False) as c:
        auth = {"Authorization": f"Bearer {KEY}", "Content-Type": content_type}
        r = c.post("/v1/chat/completions", content=body, headers=auth)
        assert r.status_code == 415, r.text
        assert r.json()["error"] == {"message": r.json()["error"]["message"], "type": "invalid_request_error",
                                     "param": None, "code": "unsupported_media_type"}
        assert c.post("/tokenize", content=b'{"model": "m", "prompt": "x"}', headers=auth).status_code == 415
        r = c.post("/v1/messages", content=body, headers=auth)
        assert r.status_code == 415 and r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "invalid_request_error" and "application/json" in r.json()["error"]["message"]
    assert backend.seen == []


def test_a_form_post_is_a_415(backend):
    with client_of(backend) as c:
        r = c.post("/v1/chat/completions", data={"model": "m"})
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
        r = c.post("/v1/chat/completions", files={"f": ("x.json", b"{}")})
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    assert backend.seen == []


@pytest.mark.parametrize("content_type", [None, "application/json", "application/json; charset=utf-8",
                                          "Application/JSON", "application/vnd.api+json"])
def test_json_bodies_are_read_with_or_without_a_content_type(backend, content_type):
    # Raw HTTP clients may send none (the suite's own tests do); SDKs and httpx's json= send application/json.
    headers = {"Content-Type": content_type} if content_type else {}
    with client_of(backend) as c:
        r = c.post("/v1/chat/completions", content=b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}',
                   headers=headers)
        assert r.status_code == 200, r.text


def test_the_policy_reads_hosts_and_origins_as_browsers_send_them():
    assert split_host("[::1]:8000") == ("::1", "8000")
    assert split_host("Evil.Example.:80") == ("evil.example", "80")
    assert split_host("a:b:c") is None and split_host("") is None
    assert normal_origin("HTTPS://App.Example.com:443") == "https://app.example.com"
    assert normal_origin("null") is None and normal_origin("https://a.example/path") is None
    assert BrowserPolicy().host_allowed(REBOUND)  # no Host check unless the server says (keyed, tests)
    assert not BrowserPolicy(allowed_hosts=()).host_allowed(REBOUND)
    assert browser_policy(False, ["x"]).allowed_hosts is None and browser_policy(True, ["x"]).allowed_hosts == ("x",)
    assert entries(["a", "b"], " b, c ,,", None) == ("a", "b", "c")


def test_config_refuses_entries_that_are_not_hosts_or_origins():
    assert AuthConfig(allowed_hosts=["llm.internal", "llm.internal:8000", ".corp.example", "[fd00::1]:80", "*"],
                      allowed_origins=["https://app.example.com", "http://10.0.0.5:3000", "*"])
    with pytest.raises(ValidationError, match="allowed_hosts entry 'http://llm.internal'"):
        AuthConfig(allowed_hosts=["http://llm.internal"])
    with pytest.raises(ValidationError, match="allowed_origins entry 'https://app.example.com/'"):
        AuthConfig(allowed_origins=["https://app.example.com/"])
    with pytest.raises(ValidationError, match="allowed_origins entry 'null'"):
        AuthConfig(allowed_origins=["null"])
