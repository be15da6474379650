"""The test embedder (all-MiniLM-L6-v2 as a GGUF): where it is, built on first use."""

from __future__ import annotations

import pytest

from tools.minilm_gguf import MissingWheel, cached_gguf


def embedder_gguf() -> str:
    """The cached GGUF's path; a failure that says how to install the wheel it is made from."""
    try:
        return str(cached_gguf())
    except MissingWheel as exc:
        pytest.fail(f"the test embedder cannot be built: {exc}", pytrace=False)
