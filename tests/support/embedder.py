"""The test embedder (all-MiniLM-L6-v2 as a GGUF) and the test reranker made from it: where they are, built on
first use."""

from __future__ import annotations

import pytest

from tools import minilm_reranker_gguf
from tools.minilm_gguf import MissingWheel, cached_gguf


def embedder_gguf() -> str:
    """The cached GGUF's path; a failure that says how to install the wheel it is made from."""
    try:
        return str(cached_gguf())
    except MissingWheel as exc:
        pytest.fail(f"the test embedder cannot be built: {exc}", pytrace=False)


def reranker_gguf() -> str:
    """The cached test reranker (tools/minilm_reranker_gguf.py: MiniLM with a fitted rank head)."""
    try:
        return str(minilm_reranker_gguf.cached_gguf())
    except MissingWheel as exc:
        pytest.fail(f"the test reranker cannot be built: {exc}", pytrace=False)
