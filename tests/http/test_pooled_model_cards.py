"""/v1/models with pooled models: each names its pool and its state (loaded, loading, available)."""

from __future__ import annotations

from starlette.testclient import TestClient

from app.http.app import build_http_app
from app.http.model_cards import ModelCard


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


def test_each_card_says_its_kind_and_context_from_its_spec(bundled_spec):
    from dataclasses import replace

    from app.config.spec import AdapterSpec
    from app.http.model_cards import model_cards

    spec = replace(bundled_spec, id="chatty", n_ctx=1024, adapters=(AdapterSpec(name="a1", path="/x.gguf"),))
    embedder = replace(bundled_spec, id="vectors", kind="embedding", n_ctx=512, adapters=())
    cards = {c.id: c.to_dict() for c in model_cards([spec, embedder])}
    assert (cards["chatty"]["kind"], cards["chatty"]["max_model_len"]) == ("chat", 1024)
    assert (cards["chatty:a1"]["kind"], cards["chatty:a1"]["max_model_len"], cards["chatty:a1"]["parent"]) == (
        "chat", 1024, "chatty")
    assert (cards["vectors"]["kind"], cards["vectors"]["max_model_len"]) == ("embedding", 512)
