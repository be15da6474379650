"""Credentials written into a source URL (`https://user:pass@host/…`, `s3://KEY:SECRET@bucket/…`) never
leave the fetch itself: every text that names a source (logs, /health, 503s, config errors, check-config)
goes through `redacted`, and the cache and lock names are made from `without_userinfo`."""

from __future__ import annotations

import re

# The userinfo of a URL: what comes between `scheme://` and the last `@` of the authority (RFC 3986: the
# authority ends at the first / ? or #). Found anywhere in a text, so a library's error message that
# quotes the URL is cleaned too.
_USERINFO = re.compile(r"(?P<scheme>\b[a-z][a-z0-9+.-]*://)(?P<userinfo>[^/?#\s'\"<>]*)@", re.I)
HIDDEN = "***"


def redacted(text: str) -> str:
    """`text` with the userinfo of every URL in it replaced by ***."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{HIDDEN}@", text)


def without_userinfo(url: str) -> str:
    """The URL with no userinfo at all: what names the object (the same object whatever the credentials)."""
    return _USERINFO.sub(lambda m: m["scheme"], url)


def userinfo(url: str) -> tuple[str, str] | None:
    """(user, password) written in the URL (percent-decoded), None when it has none."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return None
    return unquote(parts.username or ""), unquote(parts.password or "")
