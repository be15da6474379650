"""The one model check every route makes (app.api.errors.served_model)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.api.errors import APIError, served_model

MODELS = {m.id: m for m in (SimpleNamespace(id="chat", kind="chat"), SimpleNamespace(id="emb", kind="embedding"),
                            SimpleNamespace(id="rr", kind="rerank"))}


def test_a_model_of_the_routes_kind_is_served():
    assert served_model(MODELS, "emb", "embedding", "/v1/embeddings") is MODELS["emb"]


def test_an_unknown_model_is_a_404():
    with pytest.raises(APIError) as info:
        served_model(MODELS, "nope", "chat", "/v1/messages/count_tokens")
    assert info.value.status == 404 and info.value.param == "model"


@pytest.mark.parametrize("model, what", [("emb", "an embedding model"), ("rr", "a reranker")])
def test_a_model_of_another_kind_is_a_400_saying_what_it_serves(model, what):
    with pytest.raises(APIError) as info:
        served_model(MODELS, model, "chat", "/v1/messages/count_tokens")
    err = info.value
    assert err.status == 400 and err.param == "model" and err.code == "unsupported_model"
    assert f"is {what}" in err.message and "not /v1/messages/count_tokens" in err.message
