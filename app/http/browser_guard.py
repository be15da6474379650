"""What a web page may make this server do. A server without keys on 127.0.0.1 is reachable from every page
the user's browser opens: a page can send it requests that need no CORS preflight (a POST of text/plain or
a form, a GET), and a name the attacker controls can resolve to 127.0.0.1 later (DNS rebinding), so that the
page's own origin is this server. Three checks, as Ollama, Jupyter and Django do:

- Host (only without API keys): the request's Host must be a loopback name, an IP address, or a configured
  host. A rebound request carries the attacker's name (`evil.example:8000`), never an address: a page whose
  URL is an address is served by whoever owns it, so no page can rebind one. With keys, a page has no key
  to send (a browser sends `Authorization` only after a preflight this server refuses), so any Host is
  served, as clusters behind a load balancer need.
- Origin (always): a request that carries an Origin (every cross-origin request a browser sends, and every
  POST) is refused unless that origin is loopback (`http://localhost:3000`) or configured. Clients that are
  not browsers send none and are not concerned.
- Content-Type (every JSON body, in server.py's body reader): `application/json` (or `+json`), or none at
  all, as raw HTTP clients send (curl's `-d` sends a form type); a form or text/plain (what a page can send
  without a preflight) is a 415. A page can send a body with no Content-Type too (a Blob without a type),
  but then still its Origin, or once rebound its Host, which the checks above refuse.

Allowed origins, and only they, get CORS headers, so a local web app can call the API from the page.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from ..api.errors import APIError

HOSTS_ENV = "LLAMARAY_ALLOWED_HOSTS"
ORIGINS_ENV = "LLAMARAY_ALLOWED_ORIGINS"
ANY = "*"  # an allowed_hosts or allowed_origins entry that turns that check off

_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[^:\[\]]*)(?::(\d{1,5}))?$")
_ORIGIN = re.compile(r"^(https?)://(\[[0-9a-fA-F:.]+\]|[^/:\[\]]+)(?::(\d{1,5}))?$", re.IGNORECASE)
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def split_host(value: str) -> tuple[str, str | None] | None:
    """A Host header (or an allowed_hosts entry) as (lower-case name or address without brackets, port or
    None); None when it is not a host at all."""
    match = _HOST_PORT.match(value.strip())
    if not match or not match.group(1):
        return None
    return match.group(1).strip("[]").lower().rstrip("."), match.group(2)


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """localhost and its subdomains (RFC 6761: never resolved by DNS), 127.0.0.0/8, ::1."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def normal_origin(value: str) -> str | None:
    """`scheme://host[:port]` lower-cased, without the scheme's default port; None if `value` is not an
    origin of a page served over HTTP(S) ("null", file://, a path)."""
    match = _ORIGIN.match(value.strip())
    if not match:
        return None
    scheme, host, port = match.group(1).lower(), match.group(2).lower(), match.group(3)
    port = None if port == _DEFAULT_PORTS[scheme] else port
    return f"{scheme}://{host}" + (f":{port}" if port else "")


def _host_entry_matches(entry: str, host: str, port: str | None) -> bool:
    """`name` (any port), `name:port`, or `.domain` (the domain and its subdomains, any port)."""
    if entry.startswith("."):
        return host == entry[1:] or host.endswith(entry)
    parsed = split_host(entry)
    return parsed is not None and parsed[0] == host and parsed[1] in (None, port)


@dataclass(frozen=True)
class BrowserPolicy:
    """Which Hosts and Origins this server answers (beyond loopback ones). `allowed_hosts` None: the Host
    is not checked (a server with keys; apps built in unit tests). The Ingress builds it with
    `browser_policy`."""

    allowed_hosts: tuple[str, ...] | None = None
    allowed_origins: tuple[str, ...] = ()

    def host_allowed(self, header: str | None) -> bool:
        if self.allowed_hosts is None or not header:  # no Host: HTTP/1.0, never a browser
            return True
        parsed = split_host(header)
        if parsed is None:
            return False
        host, port = parsed
        return (is_ip(host) or is_loopback(host) or ANY in self.allowed_hosts
                or any(_host_entry_matches(entry.lower(), host, port) for entry in self.allowed_hosts))

    def origin_allowed(self, origin: str) -> bool:
        if ANY in self.allowed_origins:
            return True
        normal = normal_origin(origin)
        if normal is None:  # "null" (sandboxed frames, file://): any site can make one
            return False
        host = _ORIGIN.match(normal).group(2).strip("[]")
        return is_loopback(host) or normal in {normal_origin(o) for o in self.allowed_origins}


def entries(*sources: Iterable[str] | str | None) -> tuple[str, ...]:
    """Configured entries from lists and comma-separated strings (an environment variable), in order, once."""
    out: list[str] = []
    for source in sources:
        items = source.split(",") if isinstance(source, str) else (source or ())
        out += [item.strip() for item in items if item.strip() and item.strip() not in out]
    return tuple(out)


def browser_policy(keyless: bool, hosts: Iterable[str] = (), origins: Iterable[str] = ()) -> BrowserPolicy:
    """The policy of a server: the Host is checked only when it has no keys."""
    return BrowserPolicy(tuple(hosts) if keyless else None, tuple(origins))


def host_not_allowed(host: str) -> APIError:
    return APIError(f"Host {host!r} is not allowed: a server without API keys answers only loopback names, IP "
                    f"addresses and the hosts in auth.allowed_hosts (${HOSTS_ENV}).", status=403,
                    type="invalid_request_error", code="host_not_allowed")


def origin_not_allowed(origin: str) -> APIError:
    return APIError(f"Origin {origin!r} is not allowed: requests from web pages are answered only from loopback "
                    f"origins and those in auth.allowed_origins (${ORIGINS_ENV}).", status=403,
                    type="invalid_request_error", code="origin_not_allowed")


def unsupported_media_type(content_type: str) -> APIError:
    return APIError(f"Content-Type {content_type!r} is not supported: send the body as JSON with "
                    "`Content-Type: application/json`.", status=415, type="invalid_request_error",
                    code="unsupported_media_type")


def check_json_content_type(content_type: str | None) -> None:
    """A JSON body's Content-Type: application/json or application/*+json (any parameters), or none."""
    if not content_type:
        return
    media = content_type.split(";", 1)[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        raise unsupported_media_type(content_type)


Refuse = Callable[[APIError, Scope], ASGIApp]
"""The response that refuses a request (the route's protocol shapes the error)."""


class BrowserGuardMiddleware:
    """Refuses a request whose Host (keyless servers) or Origin is not allowed, before any route or key check,
    so a refused page learns nothing, whatever the route."""

    def __init__(self, app: ASGIApp, policy: BrowserPolicy, refuse: Refuse) -> None:
        self.app = app
        self.policy = policy
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            host = headers.get(b"host", b"").decode("latin-1")
            origin = headers.get(b"origin", b"").decode("latin-1")
            error = None
            if not self.policy.host_allowed(host):
                error = host_not_allowed(host)
            elif origin and not self.policy.origin_allowed(origin):
                error = origin_not_allowed(origin)
            if error is not None:
                await self.refuse(error, scope)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class AllowedOriginsCORS(CORSMiddleware):
    """Starlette's CORS, answering only the policy's origins (each by name, never `*`): preflights, and the
    headers that let an allowed page read a reply. Placed before the key check: a preflight carries no key."""

    def __init__(self, app: ASGIApp, policy: BrowserPolicy, **options: Any) -> None:
        super().__init__(app, allow_methods=["GET", "POST", "DELETE"], allow_headers=["*"],
                         expose_headers=["Retry-After"], max_age=600, **options)
        self.policy = policy

    def is_allowed_origin(self, origin: str) -> bool:
        return self.policy.origin_allowed(origin)
