"""API keys: `Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key: <key>` (Anthropic's) on
every route but /health.

Keys come from an environment variable or a secret file, never from serve_config.yaml itself
(that file is checked in and shown by `serve status`). The file is either a key per line or key policies
(app/tenants/policies.py: hashed keys with their limits and models), re-read when it changes. Keys are
looked up by their SHA-256 and never logged.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..tenants.policies import KeyPolicy
from ..tenants.registry import KeyRegistry

DEFAULT_ENV = "LLAMARAY_API_KEYS"


class MissingKeys(RuntimeError):
    """`auth.required` is set and no key was loaded: the replica must not serve without auth."""


def require_keys(keys: KeyRegistry, required: bool, env_var: str | None, key_file: str | None) -> None:
    if required and not keys.enabled:
        sources = " or ".join(filter(None, [f"${env_var}" if env_var else None, key_file])) or "no source configured"
        raise MissingKeys(f"auth.required is true but no API key was loaded (looked in {sources}); set the keys "
                          f"in this replica's environment or file, or set auth.required: false")


def load_key_registry(env_var: str | None = DEFAULT_ENV, key_file: str | None = None,
                      on_reload: Callable[[bool, str], None] | None = None) -> KeyRegistry:
    """The keys of `$env_var` (comma or newline separated, no policy) and of `key_file` (plain or policies),
    the file re-read when it changes."""
    env_keys = os.environ[env_var].replace(",", "\n").splitlines() if env_var and os.environ.get(env_var) else []
    return KeyRegistry([k.strip() for k in env_keys if k.strip()], key_file, on_reload=on_reload)


class KeyChecker:
    """The keys a request may carry. `keys`: plain keys (no policy); `registry`: the keys in force, with their
    policies (built from `keys` when not given)."""

    def __init__(self, keys: tuple[bytes, ...] = (), registry: KeyRegistry | None = None) -> None:
        self.registry = registry or KeyRegistry([k.decode() for k in keys])

    @property
    def enabled(self) -> bool:
        return self.registry.enabled

    def identify(self, authorization: str | None, api_key: str | None = None) -> tuple[bytes, KeyPolicy] | None:
        """The key the request carries (Bearer token, else x-api-key) with its policy, if it is one in force."""
        given = None
        if authorization and authorization[:7].lower() == "bearer ":
            given = authorization[7:].strip().encode()
        elif api_key:
            given = api_key.strip().encode()
        if not given:
            return None
        policy = self.registry.find(given)
        return None if policy is None else (given, policy)

    def match(self, authorization: str | None, api_key: str | None = None) -> bytes | None:
        found = self.identify(authorization, api_key)
        return None if found is None else found[0]

    def check(self, authorization: str | None, api_key: str | None = None) -> bool:
        return not self.enabled or self.match(authorization, api_key) is not None
