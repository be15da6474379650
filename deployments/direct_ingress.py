"""An Ingress replica's own port (Serve's direct ingress) bound with SO_REUSEADDR.

Ray Serve 2.60 binds a direct-ingress replica's HTTP socket without SO_REUSEADDR
(serve/_private/http_util.py, `start_asgi_http_server`). Connections that the replica before it on that
port closed first (an idle keep-alive timing out, `Connection: close`) stay in TIME_WAIT for a minute on
Linux, and until they are gone such a bind fails: the replica replacing a killed one fails to start, Serve
blocks the port, and with `make run`'s one-port range the server stayed down for 62 s where a replacement
takes 5-10 s. SO_REUSEADDR is what uvicorn, llama-server and other servers set; it still refuses a port that
another socket listens on (tests/deployments/test_direct_ingress.py holds both).

Only the socket Serve's HTTP helper creates gets it: the module's `socket` name is swapped for a copy of
the module whose `socket()` sets the option, in this replica's process.
"""

from __future__ import annotations

import logging
import socket
import sys
import types

logger = logging.getLogger("ray.serve")


def _reusable_socket(*args, **kwargs) -> socket.socket:
    sock = socket.socket(*args, **kwargs)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return sock


def bind_with_reuse_address() -> bool:
    """Make Serve's direct-ingress bind in this process use SO_REUSEADDR; True once it does. Windows is left
    alone (there the option lets a second listener take the port)."""
    if sys.platform == "win32":
        return False
    from ray.serve._private import http_util

    current = getattr(http_util, "socket", None)
    if isinstance(current, types.ModuleType) and getattr(current, "socket", None) is _reusable_socket:
        return True
    if current is not socket:  # Serve's helper changed: keep its own bind, say so once
        logger.warning("ray.serve's HTTP helper no longer binds through `socket`: a replica replacing a dead "
                       "one may wait for its port's closing connections (up to a minute)")
        return False
    shim = types.ModuleType("socket")
    shim.__dict__.update(vars(socket))
    shim.socket = _reusable_socket  # type: ignore[attr-defined]
    http_util.socket = shim  # type: ignore[attr-defined]
    return True
