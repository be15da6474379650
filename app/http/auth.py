"""API keys: `Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key: <key>` (Anthropic's) on
every route but /health.

Keys come from an environment variable or a secret file, never from serve_config.yaml itself
(that file is checked in and shown by `serve status`). Keys are compared in constant time and
never logged.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

DEFAULT_ENV = "LLAMARAY_API_KEYS"


def load_api_keys(env_var: str | None = DEFAULT_ENV, key_file: str | None = None) -> tuple[bytes, ...]:
    """Keys from `$env_var` (comma or newline separated) and `key_file` (one per line, # comments)."""
    keys: list[str] = []
    if env_var and os.environ.get(env_var):
        keys += os.environ[env_var].replace(",", "\n").splitlines()
    if key_file:
        path = Path(os.path.expanduser(key_file))
        keys += [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
    return tuple(sorted({k.strip().encode() for k in keys if k.strip()}))


class MissingKeys(RuntimeError):
    """`auth.required` is set and no key was loaded: the replica must not serve without auth."""


def require_keys(keys: tuple[bytes, ...], required: bool, env_var: str | None, key_file: str | None) -> None:
    if required and not keys:
        sources = " or ".join(filter(None, [f"${env_var}" if env_var else None, key_file])) or "no source configured"
        raise MissingKeys(f"auth.required is true but no API key was loaded (looked in {sources}); set the keys "
                          f"in this replica's environment or file, or set auth.required: false")


class KeyChecker:
    def __init__(self, keys: tuple[bytes, ...]) -> None:
        self.keys = keys

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def match(self, authorization: str | None, api_key: str | None = None) -> bytes | None:
        """The configured key the request carries (Bearer token, else x-api-key), or None."""
        given = None
        if authorization and authorization[:7].lower() == "bearer ":
            given = authorization[7:].strip().encode()
        elif api_key:
            given = api_key.strip().encode()
        if not given:
            return None
        # Compare against every key, always: timing does not reveal which key (or prefix) matched.
        found = None
        for key in self.keys:
            if hmac.compare_digest(given, key):
                found = key
        return found

    def check(self, authorization: str | None, api_key: str | None = None) -> bool:
        return not self.keys or self.match(authorization, api_key) is not None
