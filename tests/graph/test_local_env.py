"""The graph as `make run` starts it (`llamaray serve-local`, `topology: single`): Ray Serve with
app/ops/ray_env.py's settings, one Ingress replica that renders prompts and runs the models' engines itself
and serves HTTP on the config's port without Serve's proxy in between. What only this shape has: the
port, the engines' own admission bound, a killed replica coming back on the same port."""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import socket
import time

import httpx
import openai
import pytest
from ray import serve

from tests.support.openapi_spec import assert_valid
from tests.support.serve_harness import (APP, EMBED_MODEL, KEY_A, MODEL, REPRODUCIBLE, RERANK_MODEL, THINK_MODEL,
                                        THINKING_MODEL)

pytestmark = [pytest.mark.timeout(600), pytest.mark.parametrize("shape", ["single"], indirect=True)]


def wait_idle(cluster, timeout_s: float = 15) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = cluster.model_stats(MODEL)
        if stats["running"] == 0 and stats["waiting"] == 0:
            return stats
        time.sleep(0.1)
    raise AssertionError(f"engine still busy: {cluster.model_stats(MODEL)}")


def listening_pid(port: int) -> int | None:
    """The process with a listening TCP socket on `port` (from /proc: no extra dependency)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                    inodes.add(fields[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}").removeprefix("socket:[").rstrip("]") in inodes for fd in fds):
                return int(pid)
        except OSError:
            continue
    return None


def test_one_replica_serves_http_itself_and_runs_the_model(cluster):
    assert set(serve.status().applications[APP].deployments) == {"Ingress"}
    info = cluster.handle("Ingress").replica_info.remote().result()
    placed = {model: {k: about[k] for k in ("n_threads", "n_gpu_layers")} for model, about in info["models"].items()}
    assert placed == {MODEL: {"n_threads": 2, "n_gpu_layers": 0}, THINK_MODEL: {"n_threads": 2, "n_gpu_layers": 0},
                      THINKING_MODEL: {"n_threads": 1, "n_gpu_layers": 0},
                      EMBED_MODEL: {"n_threads": 1, "n_gpu_layers": 0}, RERANK_MODEL: {"n_threads": 1, "n_gpu_layers": 0}}
    # The port clients call is the Ingress replica's own socket, not Serve's proxy's.
    assert listening_pid(cluster.port) == info["pid"]
    assert httpx.get(f"{cluster.url}/health", timeout=10).json() == {"status": "ok"}


def test_make_run_shape_serves_chat_and_streams(cluster):
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=KEY_A, max_retries=0, timeout=120)
    body = dict(model=MODEL, messages=[{"role": "user", "content": "Name a color."}], max_tokens=12, seed=2,
                extra_body=REPRODUCIBLE)
    whole = client.chat.completions.create(**body)
    assert_valid("CreateChatCompletionResponse", whole.model_dump(exclude_unset=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**body, stream=True)
                       if c.choices)
    assert whole.choices[0].message.content and streamed == whole.choices[0].message.content
    tokens = httpx.post(f"{cluster.url}/tokenize", json={"model": MODEL, "prompt": "Hello there"}, timeout=30,
                        headers=cluster.headers).json()
    assert tokens["count"] == len(tokens["tokens"]) > 0


def test_bad_input_is_an_openai_error_from_the_replica(cluster):
    r = httpx.post(f"{cluster.url}/v1/chat/completions", json={"model": MODEL, "messages": [], "max_tokens": 4},
                   timeout=30, headers=cluster.headers)
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = httpx.post(f"{cluster.url}/v1/chat/completions", timeout=30, headers=cluster.headers, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100_000})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_disconnects_free_the_engine_slots(cluster):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 800,
            "stream": True, "temperature": 1.0, "min_p": 0.0, "top_k": 0}

    def open_and_drop(_):
        with httpx.Client(base_url=cluster.url, timeout=30, headers=cluster.headers) as c, c.stream("POST", "/v1/chat/completions",
                                                                          json=body) as r:
            for line in r.iter_lines():
                if '"content"' in line:
                    return r.status_code
        return r.status_code

    with cf.ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(open_and_drop, range(4)))
    assert codes == [200] * 4
    stats = wait_idle(cluster)
    assert stats["healthy"]


def test_overload_is_an_openai_503_and_accepted_requests_complete(cluster):
    # 4 slots and up to 4 waiting per slot (deployments/engine_host.py): of 40 at once, some are refused.
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 16}

    def one(_):
        r = httpx.post(f"{cluster.url}/v1/chat/completions", json=body, timeout=120, headers=cluster.headers)
        return r.status_code, r.headers.get("retry-after"), r.json()

    with cf.ThreadPoolExecutor(40) as pool:
        results = list(pool.map(one, range(40)))
    codes = sorted(r[0] for r in results)
    assert 200 in codes and 503 in codes and set(codes) == {200, 503}, codes
    for status, retry_after, reply in results:
        if status == 503:
            assert reply["error"]["code"] == "overloaded" and retry_after == "1", reply
        else:
            assert reply["usage"]["completion_tokens"] > 0
    wait_idle(cluster)


def _close_from_the_server_side(port: int) -> None:
    """A request the server answers and then closes (`Connection: close`): the replica's end of it stays in
    TIME_WAIT for a minute, as idle keep-alive connections the server times out leave it."""
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        while conn.recv(65536):  # until the server's FIN: it closed first
            pass


# A replica killed and replaced (~10 s): make test-slow.
@pytest.mark.slow
def test_a_killed_replica_comes_back_on_the_same_port(cluster):
    """Serve replaces the dead Ingress replica (and with it the engine); the new one binds the same port at once,
    though the dead one's closed connections still hold it in TIME_WAIT (deployments/direct_ingress.py)
    and nothing holds it back (RAY_SERVE_PORT_QUARANTINE_S=0)."""
    _close_from_the_server_side(cluster.port)
    old = cluster.handle("Ingress").replica_info.remote().result()["pid"]
    os.kill(old, signal.SIGKILL)
    # A replacement takes 5-15 s here; one that could not bind would wait out the TIME_WAIT (60 s on Linux).
    deadline = time.monotonic() + 45
    pid = None
    while time.monotonic() < deadline:
        pid = listening_pid(cluster.port)
        if pid not in (None, old) and cluster.healthy():
            break
        time.sleep(0.5)
    assert pid not in (None, old), "no new replica listens on the port"
    assert cluster.handle("Ingress").replica_info.remote().result()["pid"] == pid
    r = httpx.post(f"{cluster.url}/v1/chat/completions", timeout=60, headers=cluster.headers, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0
