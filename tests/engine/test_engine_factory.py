"""One place picks a model's engine from its entry (app/engine/factory.py), and each engine is what hosts
call (app/engine/protocol.py): a generating engine for a chat model, a pooling one for an embedding model or
a reranker. And the shared decode thread: a stopped engine refuses new work with an engine error."""

from __future__ import annotations

import pytest

from app.config.resolution import resolve_model
from app.config.schema import ModelConfig, SyntheticSettings
from app.engine import GenerationRequest
from app.engine.embedder import EmbeddingEngine
from app.engine.engine import LlamaEngine
from app.engine.errors import EngineError
from app.engine.factory import start_engine
from app.engine.protocol import Engine, GenerationEngine, PoolingEngine
from app.engine.synthetic import SyntheticEngine


def started(spec, protocol):
    engine = start_engine(spec)
    try:
        return type(engine), isinstance(engine, protocol), engine.healthy()
    finally:
        engine.close()


def test_a_synthetic_model_gets_the_synthetic_engine_and_a_closed_one_refuses_work():
    spec = resolve_model(ModelConfig(id="syn", engine="synthetic", n_ctx=256, n_seq_max=2, stream_interval_ms=0,
                                     synthetic=SyntheticSettings(step_ms=[(1, 1.0)])))
    engine = start_engine(spec)
    assert isinstance(engine, SyntheticEngine) and isinstance(engine, GenerationEngine) and engine.healthy()
    engine.close()
    assert not engine.healthy() and engine.broken == "engine closed"
    with pytest.raises(EngineError) as err:
        engine.submit(engine.prepare(GenerationRequest("r", "hi", max_tokens=2), lambda ev: None))
    assert (err.value.kind, err.value.code) == ("unavailable", "engine_unavailable")


def test_a_chat_model_gets_the_llama_engine(bundled_spec):
    assert started(bundled_spec, GenerationEngine) == (LlamaEngine, True, True)


@pytest.mark.parametrize("spec_fixture", ["embedder_spec", "reranker_spec"])
def test_an_embedding_model_and_a_reranker_get_the_pooling_engine(spec_fixture, request):
    assert started(request.getfixturevalue(spec_fixture), PoolingEngine) == (EmbeddingEngine, True, True)


def test_every_engine_is_an_engine(engine, embedder):
    assert isinstance(engine, Engine) and isinstance(embedder, Engine)
    assert not isinstance(embedder, GenerationEngine)  # it generates nothing: no sink, no cancel
