"""The Ray harness (tests/support/serve_harness.py) after a cluster that failed to start: its environment is
gone from this process, so the next cluster starts with its own. (A Ray node that timed out during start-up once
left `make run`'s one-port range set, and every later graph cluster failed to place a second Ingress replica.)
No Ray is started or stopped: `ray.init` is made to fail as the node's start-up did, and a cluster other tests
share in this process stays as it is."""

from __future__ import annotations

import os

import pytest

from tests.support import serve_harness
from tests.support.serve_harness import ServeCluster, load_config


def test_a_cluster_that_fails_to_start_takes_its_environment_back(monkeypatch):
    import ray
    from ray import serve

    def node_timed_out(*args, **kwargs):
        raise Exception("The current node timed out during startup.")

    monkeypatch.setattr(ray, "init", node_timed_out)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(serve, "shutdown", lambda: None)
    monkeypatch.setattr(serve_harness.POOL, "release", lambda: None)
    monkeypatch.setenv("LLAMARAY_HARNESS_PROBE", "before")
    monkeypatch.delenv("LLAMARAY_HARNESS_NEW", raising=False)
    cluster = ServeCluster(load_config("configs/local-cpu.yaml"), num_cpus=1, serve_local=True,
                           env={"LLAMARAY_HARNESS_PROBE": "during", "LLAMARAY_HARNESS_NEW": "1"})
    assert "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT" in cluster.env  # what leaked before
    saved = os.environ.get("RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT")
    with pytest.raises(Exception, match="timed out during startup"):
        cluster.__enter__()
    assert os.environ["LLAMARAY_HARNESS_PROBE"] == "before"
    assert "LLAMARAY_HARNESS_NEW" not in os.environ
    assert os.environ.get("RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT") == saved
