"""Ports in the states a restarted server meets."""

from __future__ import annotations

import socket


def time_wait_port() -> int:
    """A port whose only trace is a server-side connection in TIME_WAIT (the server closed first), as a
    server that served a client and exited, or was killed, leaves it."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind (uvicorn, llama-server)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()  # the server side closes first: its end goes to TIME_WAIT
    client.recv(1)
    client.close()
    server.close()
    return port
