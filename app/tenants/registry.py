"""The keys in force: those of the environment and of the keys file, re-read when the file changes (a
Kubernetes Secret mounted as a volume is swapped in place by the kubelet), without a restart. A file that
cannot be used on reload is refused with its line number and the policies in force stay."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .policies import KeyPolicies, KeyPolicy, KeysFileError, is_policy_file, key_hash, parse_key_policies

log = logging.getLogger("llamaray.tenants")

# How often a request may trigger a look at the file (one stat): a changed file is in force within this.
CHECK_EVERY_S = 2.0


def plain_policies(keys: list[str]) -> list[KeyPolicy]:
    """Keys without policies (the environment variable, a key-per-line file): no limits, named by their
    hash's start so usage and metrics can tell them apart without showing them."""
    return [KeyPolicy(name=f"key-{key_hash(k)[:8]}", key_sha256=key_hash(k)) for k in keys]


def read_keys_file(path: Path) -> list[KeyPolicy]:
    text = path.read_text()
    if is_policy_file(text):
        return parse_key_policies(text, str(path))
    return plain_policies([line.strip() for line in text.splitlines()
                           if line.strip() and not line.lstrip().startswith("#")])


class KeyRegistry:
    """`env_keys`: keys from the environment (fixed for the process's life); `path`: the keys file, if any.
    `on_reload(ok, message)`: told of each reload (a metric, a log line)."""

    def __init__(self, env_keys: list[str], path: str | None = None, *, check_every_s: float = CHECK_EVERY_S,
                 on_reload: Callable[[bool, str], None] | None = None, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.path = Path(os.path.expanduser(path)) if path else None
        self.check_every_s = check_every_s
        self.on_reload = on_reload or (lambda ok, message: None)
        self.clock = clock
        self._env = plain_policies(env_keys)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._checked = clock()
        file_policies = read_keys_file(self.path) if self.path else []  # at start a bad file is fatal
        self._stamp = self._file_stamp()
        self.policies = self._merge(file_policies)

    @property
    def enabled(self) -> bool:
        return len(self.policies) > 0

    def find(self, key: bytes) -> KeyPolicy | None:
        self._maybe_reload()
        return self.policies.find(key)

    def find_hash(self, key_sha256: str) -> KeyPolicy | None:
        """The policy in force for the key whose hash is `key_sha256` (a batch runs under its key's, as it is now)."""
        self._maybe_reload()
        return self.policies.by_hash.get(key_sha256)

    def _merge(self, file_policies: list[KeyPolicy]) -> KeyPolicies:
        # The file's policy wins over the same key given in the environment without one.
        return KeyPolicies.of([*self._env, *file_policies])

    def _file_stamp(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            st = self.path.stat()  # follows the symlink a mounted Secret swaps
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _maybe_reload(self) -> None:
        if self.path is None or self.clock() - self._checked < self.check_every_s:
            return
        with self._lock:
            if self.clock() - self._checked < self.check_every_s:
                return
            self._checked = self.clock()
            stamp = self._file_stamp()
            if stamp == self._stamp:
                return
            self.reload(stamp)

    def reload(self, stamp: tuple[int, int, int] | None = None) -> bool:
        """Read the file now; False (and the policies in force kept) when it cannot be used."""
        stamp = stamp if stamp is not None else self._file_stamp()
        try:
            if self.path is None:
                return True
            policies = read_keys_file(self.path)
        except (OSError, UnicodeDecodeError, KeysFileError) as exc:
            self._stamp = stamp  # not re-read until it changes again
            message = f"keys file not reloaded, the {len(self.policies)} keys in force stay: {exc}"
            log.error("%s", message)
            self.on_reload(False, message)
            return False
        self._stamp = stamp
        self.policies = self._merge(policies)
        message = f"keys file reloaded: {len(self.policies)} keys"
        log.info("%s", message)
        self.on_reload(True, message)
        return True
