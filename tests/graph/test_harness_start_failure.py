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


def test_a_node_that_times_out_is_started_once_more_and_its_processes_killed(monkeypatch, tmp_path):
    """Ray's node not up within its 30 s: the processes that attempt started (children of this process, named by
    their session directory) are killed, and the start is tried once more; a second time out is the error."""
    import subprocess
    import sys
    import time

    import ray

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    (tmp_path / "ray").mkdir()
    left: list[subprocess.Popen] = []

    def node_timed_out():  # as ray.init: a new session, its head processes started, then the time out
        session = tmp_path / "ray" / f"session_{len(left)}"
        (session / "logs").mkdir(parents=True)
        latest = tmp_path / "ray" / "session_latest"
        latest.unlink(missing_ok=True)
        latest.symlink_to(session)
        left.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)",
                                      f"--log_dir={session}/logs"]))
        raise Exception("The current node timed out during startup. This could happen because ...")

    try:
        with pytest.raises(Exception, match="timed out during startup"):
            serve_harness.start_local_ray(node_timed_out)
        assert len(left) == 2  # tried twice
        deadline = time.monotonic() + 10
        while any(p.poll() is None for p in left):
            assert time.monotonic() < deadline, "a failed start's process is still running"
            time.sleep(0.05)
        assert [p.returncode for p in left] == [-9, -9]
    finally:
        for p in left:
            p.kill()

    calls = []

    def other_error():
        calls.append(1)
        raise ValueError("not a start-up time out")

    with pytest.raises(ValueError):
        serve_harness.start_local_ray(other_error)
    assert calls == [1]  # anything else is not retried


def test_a_failed_start_does_not_start_a_ray_to_shut_serve_down(monkeypatch):
    """The cluster's teardown after a failed ray.init: no serve.shutdown, which would connect to (start) a Ray."""
    import ray
    from ray import serve

    shut = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: (_ for _ in ()).throw(Exception("timed out during startup")))
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(serve, "shutdown", lambda: shut.append(1))
    monkeypatch.setattr(serve_harness.POOL, "release", lambda: None)
    monkeypatch.setattr(serve_harness, "kill_session_processes", lambda session: [])
    cluster = ServeCluster(load_config("configs/local-cpu.yaml"), num_cpus=1, serve_local=True)
    with pytest.raises(Exception, match="timed out during startup"):
        cluster.__enter__()
    assert shut == []
