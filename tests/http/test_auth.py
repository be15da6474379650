"""API keys fail closed: any prefix the app is mounted under, any route but /health, and a replica
that must have keys refuses to start without them."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from app.http.auth import KeyChecker, MissingKeys, load_key_registry, require_keys
from app.http.app import build_http_app
from app.http.endpoints import ServerSettings
from app.http.model_cards import ModelCard
from app.http.request_state import route_path

KEY = "sk-test-" + "k" * 24


class Backend:
    """Nothing is generated in these tests: auth answers before any route."""


@pytest.fixture
def app():
    return build_http_app(Backend(), [ModelCard("m")], ServerSettings(keys=KeyChecker((KEY.encode(),))))


@pytest.mark.parametrize("root_path", ["", "/llm", "/a/b"])
def test_every_route_but_health_needs_a_key_under_any_prefix(app, root_path):
    # Serve keeps route_prefix in `path` and sets `root_path`: a check on the raw path (startswith "/v1")
    # would let every request under a prefix through.
    with TestClient(app, root_path=root_path) as client:
        for path in ("/v1/models", "/v1/models/m", "/openapi.json", "/v2/anything", "/"):
            r = client.get(root_path + path)
            assert r.status_code == 401, (root_path, path, r.status_code)
            assert r.json()["error"]["code"] == "invalid_api_key"
        assert client.get(root_path + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert client.get(root_path + "/health").status_code == 200


@pytest.mark.parametrize(("scope", "expected"), [
    ({"path": "/llm/v1/models", "root_path": "/llm"}, "/v1/models"),
    ({"path": "/llm", "root_path": "/llm"}, "/"),
    ({"path": "/v1/models", "root_path": ""}, "/v1/models"),
    ({"path": "/v1/models"}, "/v1/models"),
])
def test_route_path_strips_the_mount_prefix(scope, expected):
    assert route_path(scope) == expected


def test_required_keys_missing_is_a_clear_startup_error(monkeypatch, tmp_path):
    monkeypatch.delenv("LLAMARAY_API_KEYS", raising=False)
    keys = load_key_registry("LLAMARAY_API_KEYS", None)
    with pytest.raises(MissingKeys, match=r"auth.required is true.*\$LLAMARAY_API_KEYS"):
        require_keys(keys, True, "LLAMARAY_API_KEYS", None)
    require_keys(keys, False, "LLAMARAY_API_KEYS", None)  # optional auth: serves, with a warning
    key_file = tmp_path / "keys"
    key_file.write_text("# ops\nsk-one\n")
    require_keys(load_key_registry(None, str(key_file)), True, None, str(key_file))


class Recorder:
    """Records the caller each request arrives with."""

    def __init__(self) -> None:
        self.callers: list = []

    async def respond(self, request, caller):  # a TokenizeRequest here
        self.callers.append(caller)
        return {"tokens": [], "count": 0, "max_model_len": 8}


def test_x_api_key_is_accepted_as_well_as_bearer():
    other = "sk-test-" + "o" * 24
    recorder = Recorder()
    app = build_http_app(recorder, [ModelCard("m")], ServerSettings(keys=KeyChecker((KEY.encode(), other.encode()))))
    with TestClient(app) as client:
        body = {"model": "m", "prompt": "x"}
        assert client.post("/tokenize", json=body, headers={"x-api-key": KEY}).status_code == 200
        assert client.post("/tokenize", json=body, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert client.post("/tokenize", json=body, headers={"x-api-key": other}).status_code == 200
        assert client.post("/tokenize", json=body, headers={"x-api-key": "wrong"}).status_code == 401
        assert client.post("/tokenize", json=body, headers={"x-api-key": ""}).status_code == 401
    first, second, third = recorder.callers
    # The processing learns who called (a digest of the key, never the key), the same for both headers.
    assert first == second and first.key_id and KEY not in first.key_id
    assert third.key_id != first.key_id


def test_health_details_only_for_a_caller_with_a_key(app):
    with TestClient(app) as client:
        public = client.get("/health")
        assert public.status_code == 200 and public.json() == {"status": "ok"}
        detailed = client.get("/health", headers={"x-api-key": KEY}).json()
        assert detailed["models"] == {"m": True} and detailed["status"] == "ok"
        assert client.get("/health", headers={"x-api-key": "wrong"}).json() == {"status": "ok"}


def test_health_details_for_anyone_without_keys():
    with TestClient(build_http_app(Backend(), [ModelCard("m")])) as client:
        assert client.get("/health").json()["models"] == {"m": True}


def test_a_key_limited_to_models_sees_and_uses_only_those(tmp_path):
    from app.tenants.policies import key_hash
    from app.tenants.registry import KeyRegistry

    limited, full = "sk-limited-" + "l" * 20, "sk-full-" + "f" * 20
    keys = tmp_path / "keys.yaml"
    adapters = "sk-adapters-" + "a" * 20
    keys.write_text(f"keys:\n  - name: narrow\n    key_sha256: {key_hash(limited)}\n    models: [m]\n"
                    f"  - name: wide\n    key_sha256: {key_hash(full)}\n"
                    f"  - name: adapters\n    key_sha256: {key_hash(adapters)}\n    models: ['m:*']\n")
    cards = [ModelCard("m"), ModelCard("m:adapter", parent="m"), ModelCard("m:v2", pool="p"), ModelCard("other")]
    app = build_http_app(Recorder(), cards, ServerSettings(keys=KeyChecker(registry=KeyRegistry([], str(keys)))))
    narrow, wide = {"Authorization": f"Bearer {limited}"}, {"Authorization": f"Bearer {full}"}
    with TestClient(app) as client:
        # `m` is the model m alone: neither its adapter nor a model whose id starts with `m:`
        assert [m["id"] for m in client.get("/v1/models", headers=narrow).json()["data"]] == ["m"]
        assert [m["id"] for m in client.get("/v1/models", headers={"Authorization": f"Bearer {adapters}"}).json()[
            "data"]] == ["m", "m:adapter"]
        assert len(client.get("/v1/models", headers=wide).json()["data"]) == 4
        for model in ("other", "m:adapter", "m:v2", "M", "m:"):
            refused = client.post("/tokenize", json={"model": model, "prompt": "x"}, headers=narrow)
            assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found", model
            assert client.get(f"/v1/models/{model}", headers=narrow).status_code == 404
        assert client.post("/tokenize", json={"model": "m", "prompt": "x"}, headers=narrow).status_code == 200
        assert client.post("/tokenize", json={"model": "other", "prompt": "x"}, headers=wide).status_code == 200
        assert client.post("/tokenize", json={"model": "m", "prompt": "x"}, headers={
            "Authorization": f"Bearer {key_hash(limited)}"}).status_code == 401  # the hash is not a key
