"""API keys fail closed: any prefix the app is mounted under, any route but /health, and a replica
that must have keys refuses to start without them."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from app.auth import KeyChecker, MissingKeys, load_api_keys, require_keys
from app.server import ModelCard, ServerSettings, build_http_app, route_path

KEY = "sk-test-" + "k" * 24


class Backend:
    async def ready(self):
        return {"m": True}


@pytest.fixture
def app():
    return build_http_app(Backend(), [ModelCard("m")], ServerSettings(keys=KeyChecker((KEY.encode(),))))


@pytest.mark.parametrize("root_path", ["", "/llm", "/a/b"])
def test_every_route_but_health_needs_a_key_under_any_prefix(app, root_path):
    # Serve keeps route_prefix in `path` and sets `root_path` (the old check on path.startswith("/v1")
    # let every request under a prefix through).
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
    keys = load_api_keys("LLAMARAY_API_KEYS", None)
    with pytest.raises(MissingKeys, match=r"auth.required is true.*\$LLAMARAY_API_KEYS"):
        require_keys(keys, True, "LLAMARAY_API_KEYS", None)
    require_keys(keys, False, "LLAMARAY_API_KEYS", None)  # optional auth: serves, with a warning
    key_file = tmp_path / "keys"
    key_file.write_text("# ops\nsk-one\n")
    require_keys(load_api_keys(None, str(key_file)), True, None, str(key_file))
