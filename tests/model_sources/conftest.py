"""A stand-in Hub serving the bundled GGUF (tests/support/fake_hub.py), reached through HF_ENDPOINT."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config.paths import resolve_path
from tests.support.fake_hub import FILE, REPO, FakeHub
from tests.support.serve_harness import BUNDLED


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    return resolve_path(BUNDLED)


@pytest.fixture
def hub(gguf_path, monkeypatch):
    with FakeHub({REPO: {FILE: gguf_path, "README.md": gguf_path}}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield server


@pytest.fixture
def roomy(monkeypatch):
    """No free-space margin: the tests' disk need only hold the file itself."""
    monkeypatch.setattr("app.model_sources.cache.FREE_MARGIN_BYTES", 0)
