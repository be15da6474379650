"""An Ingress replica's own port is bound with SO_REUSEADDR (deployments/direct_ingress.py): through Ray Serve's
own helper, a port held only by the closing connections of the replica before is served at once, and a port
another socket listens on is still refused."""

from __future__ import annotations

import asyncio
import errno
import socket

import httpx
import pytest

pytest.importorskip("ray")

from ray.serve._private import http_util  # noqa: E402
from ray.serve.config import HTTPOptions  # noqa: E402

from deployments.direct_ingress import bind_with_reuse_address  # noqa: E402
from tests.support.ports import time_wait_port  # noqa: E402


async def _hello(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})


async def _serve_once(port: int) -> str:
    """Serve's direct-ingress helper on `port`: the body a GET gets, or the bind's errno name."""
    loop = asyncio.get_running_loop()
    try:
        task, server = await http_util.start_asgi_http_server(_hello, HTTPOptions(host="127.0.0.1", port=port),
                                                              event_loop=loop)
    except RuntimeError as exc:
        return errno.errorcode[exc.__cause__.errno]
    try:
        async with httpx.AsyncClient() as client:
            for _ in range(200):  # the server task binds at once but listens once it runs
                try:
                    return (await client.get(f"http://127.0.0.1:{port}/")).text
                except httpx.ConnectError:
                    await asyncio.sleep(0.01)
        raise AssertionError("the server never answered")
    finally:
        server.should_exit = True
        await task


@pytest.fixture
def ray_helper(monkeypatch):
    monkeypatch.setattr(http_util, "socket", socket)  # Serve's own, restored after the test
    return http_util


def test_serves_a_port_held_only_by_closing_connections(ray_helper):
    port = time_wait_port()
    # What Serve does alone: the replacement replica cannot bind (the TIME_WAIT lasts a minute).
    assert asyncio.run(_serve_once(port)) == "EADDRINUSE"
    assert bind_with_reuse_address()
    assert asyncio.run(_serve_once(port)) == "hello"


def test_still_refuses_a_port_another_socket_listens_on(ray_helper):
    assert bind_with_reuse_address()
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert asyncio.run(_serve_once(taken.getsockname()[1])) == "EADDRINUSE"


def test_applies_once_and_only_to_serves_helper(ray_helper):
    assert bind_with_reuse_address() and bind_with_reuse_address()
    assert ray_helper.socket.socket(socket.AF_INET, socket.SOCK_STREAM).getsockopt(
        socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
    assert ray_helper.socket.socket.__name__ == "_reusable_socket"  # one layer: the second call kept the first
    with socket.socket() as plain:  # everyone else's sockets are as they were
        assert plain.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 0
