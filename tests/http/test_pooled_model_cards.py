"""/v1/models with pooled models: each names its pool and its state (loaded, loading, available)."""

from __future__ import annotations

from starlette.testclient import TestClient

from app.http.server import ModelCard, build_http_app


class Backend:
    pass


def test_pooled_models_carry_their_pool_and_state():
    async def states():
        return {"a": "loaded", "b": "loading"}

    cards = [ModelCard("own"), ModelCard("a", pool="tail"), ModelCard("b", pool="tail"), ModelCard("c", pool="tail")]
    with TestClient(build_http_app(Backend(), cards, pool_states=states)) as client:
        data = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
        assert "state" not in data["own"] and "pool" not in data["own"]
        assert {m: (data[m]["pool"], data[m]["state"]) for m in "abc"} == {
            "a": ("tail", "loaded"), "b": ("tail", "loading"), "c": ("tail", "available")}
        assert client.get("/v1/models/b").json()["state"] == "loading"
