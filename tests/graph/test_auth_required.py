"""`auth.required: true` with no key in the replica's environment: the app does not start, and the
deploy error says why (it never serves without auth)."""

from __future__ import annotations

import os

import pytest

from tests.support.serve_harness import MODEL, ServeCluster, load_config

# A long scenario (a cluster of its own that must refuse to start): `make test-slow`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_required_auth_without_keys_refuses_to_serve(monkeypatch):
    monkeypatch.delenv("LLAMARAY_API_KEYS", raising=False)
    assert "LLAMARAY_API_KEYS" not in os.environ
    config = load_config("configs/local-cpu.yaml", {"applications": [{
        "name": "llamaray", "route_prefix": "/llm",
        "args": {"models": [{"id": MODEL, "n_ctx": 256, "n_seq_max": 1, "startup_self_check": False}],
                 "auth": {"required": True}},
    }]})
    with pytest.raises(RuntimeError, match=r"auth.required is true but no API key was loaded"):
        with ServeCluster(config, num_cpus=2, timeout_s=180):
            pass
