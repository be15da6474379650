"""The admin routes at the HTTP edge, over a fake processing: only an admin key may call them (403 in OpenAI's
shape for any other, nothing reaching the processing); a server without keys answers its local user, but a web
page (a foreign Origin, a body a page sends without a preflight) is refused; a key limited to models gets 404 for
the others, as on every route; malformed bodies are 400s; the OpenAPI document lists them."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from app.http.auth import KeyChecker
from app.http.browser_guard import browser_policy
from app.http.app import build_http_app
from app.http.endpoints import ServerSettings
from app.http.model_cards import ModelCard
from app.pools.admin import LoadModelRequest, PinModelRequest, PoolModelsRequest, UnloadModelRequest
from app.tenants.policies import key_hash
from app.tenants.registry import KeyRegistry

ADMIN, USER, LIMITED = "sk-admin-" + "a" * 24, "sk-user-" + "u" * 24, "sk-limited-" + "l" * 24
LOCAL = "http://localhost:8000"
CARDS = [ModelCard("a", pool="tail"), ModelCard("b", pool="tail"), ModelCard("own")]
POSTS = [("/admin/models/load", {"model": "a"}), ("/admin/models/unload", {"model": "a"}),
         ("/admin/models/pin", {"model": "a", "pinned": True})]


class Backend:
    def __init__(self) -> None:
        self.seen: list[tuple[Any, Any]] = []

    async def respond(self, request, caller) -> dict[str, Any]:
        self.seen.append((request, caller))
        return {"id": getattr(request, "model", None), "object": "model"}


@pytest.fixture
def backend() -> Backend:
    return Backend()


def keyed(backend: Backend, tmp_path) -> TestClient:
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"""keys:
  - {{name: ops, key_sha256: {key_hash(ADMIN)}, admin: true}}
  - {{name: team, key_sha256: {key_hash(USER)}}}
  - {{name: narrow, key_sha256: {key_hash(LIMITED)}, admin: true, models: [b]}}
""")
    settings = ServerSettings(keys=KeyChecker(registry=KeyRegistry([], str(keys))), browser=browser_policy(False))
    return TestClient(build_http_app(backend, CARDS, settings), base_url=LOCAL)


def keyless(backend: Backend) -> TestClient:
    return TestClient(build_http_app(backend, CARDS, ServerSettings(browser=browser_policy(True))), base_url=LOCAL)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_only_an_admin_key_calls_the_admin_routes(backend, tmp_path):
    with keyed(backend, tmp_path) as client:
        for path, body in POSTS:
            r = client.post(path, json=body, headers=bearer(USER))
            assert r.status_code == 403, (path, r.text)
            assert r.json()["error"]["type"] == "invalid_request_error"
            assert r.json()["error"]["code"] == "insufficient_permissions" and "admin" in r.json()["error"]["message"]
        assert client.get("/admin/models", headers=bearer(USER)).status_code == 403
        assert client.post("/admin/models/load", json={"model": "a"}).status_code == 401
        assert backend.seen == []  # refused at the edge
        for path, body in POSTS:
            assert client.post(path, json=body, headers=bearer(ADMIN)).status_code == 200, path
        assert client.get("/admin/models", headers=bearer(ADMIN)).status_code == 200
    requests = [type(r) for r, _ in backend.seen]
    assert requests == [LoadModelRequest, UnloadModelRequest, PinModelRequest, PoolModelsRequest]
    assert all(caller.policy.name == "ops" for _, caller in backend.seen)  # the listing filters by its models


def test_a_key_limited_to_models_gets_404_for_the_others(backend, tmp_path):
    with keyed(backend, tmp_path) as client:
        r = client.post("/admin/models/load", json={"model": "a"}, headers=bearer(LIMITED))
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert client.post("/admin/models/load", json={"model": "b"}, headers=bearer(LIMITED)).status_code == 200
    assert [r.model for r, _ in backend.seen] == ["b"]


def test_bad_bodies_are_400s_and_unknown_models_404s(backend):
    with keyless(backend) as client:
        unknown = client.post("/admin/models/unload", json={"model": "zz"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        for body in ({}, {"model": 3}, {"model": "a", "pinned": "yes"}, {"model": "a", "extra": 1}, [1]):
            r = client.post("/admin/models/pin", json=body)
            assert r.status_code == 400, (body, r.text)
        malformed = client.post("/admin/models/load", content=b"{", headers={"Content-Type": "application/json"})
        assert malformed.status_code == 400
        assert client.get("/admin/models/load").status_code == 405
    assert backend.seen == []


def test_without_keys_the_local_user_is_answered_and_a_web_page_is_not(backend):
    with keyless(backend) as client:
        assert client.post("/admin/models/load", json={"model": "a"}).status_code == 200
        assert client.post("/admin/models/load", json={"model": "a"}, headers={"Origin": LOCAL}).status_code == 200
        seen = len(backend.seen)
        # What a page on another site can send: a cross-origin POST (JSON needs a preflight, refused too), and
        # a "simple" text/plain or form body that needs none.
        for headers in ({"Origin": "https://evil.example"},
                        {"Origin": "https://evil.example", "Content-Type": "text/plain"}):
            r = client.post("/admin/models/unload", content=b'{"model": "a"}', headers=headers)
            assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", r.text
        preflight = client.options("/admin/models/unload", headers={
            "Origin": "https://evil.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type"})
        assert "access-control-allow-origin" not in preflight.headers
        for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            r = client.post("/admin/models/unload", content=b'{"model": "a"}', headers={"Content-Type": content_type})
            assert r.status_code == 415, (content_type, r.text)
        rebound = client.post("/admin/models/unload", json={"model": "a"}, headers={"Host": "evil.example:8000"})
        assert rebound.status_code == 403 and rebound.json()["error"]["code"] == "host_not_allowed"
        assert len(backend.seen) == seen  # none of them reached the processing


def test_the_openapi_document_lists_the_admin_routes(backend):
    with keyless(backend) as client:
        spec = client.get("/openapi.json").json()
    assert spec["paths"]["/admin/models"]["get"]["operationId"] == "listPooledModels"
    for path, operation, schema in (("/admin/models/load", "loadPooledModel", "LoadModelRequest"),
                                    ("/admin/models/unload", "unloadPooledModel", "UnloadModelRequest"),
                                    ("/admin/models/pin", "pinPooledModel", "PinModelRequest")):
        post = spec["paths"][path]["post"]
        assert post["operationId"] == operation and {"403", "409", "404", "503"} <= set(post["responses"])
        assert spec["components"]["schemas"][schema]["required"] == ["model"]
    assert spec["components"]["schemas"]["PinModelRequest"]["properties"]["pinned"]["type"] == "boolean"
