"""The ids the batch API hands out, and the checks of ids that come back in a path: only ids this server could
have made reach the store (a path of the store is built from them), anything else is a 404 like a missing one."""

from __future__ import annotations

import hashlib
import re
import secrets
import time

FILE_PREFIX, BATCH_PREFIX, MESSAGE_BATCH_PREFIX = "file-", "batch_", "msgbatch_"
_ID = re.compile(r"^(file-|batch_|msgbatch_)[0-9a-f]{32}$")
# An owner is a key's digest (app/generation/caller.py: 16 hex digits), or the one caller of a server without keys.
LOCAL_OWNER = "local"
_OWNER = re.compile(r"^([0-9a-f]{16}|local)$")


def new_id(prefix: str) -> str:
    """A new id whose 32 hex digits start with its time in milliseconds: ids sort as they were made, so a listing
    pages through names alone (newest first) and reads only the records it returns."""
    return f"{prefix}{int(time.time() * 1000):012x}{secrets.token_hex(10)}"


def derived_id(prefix: str, of: str, what: str) -> str:
    """An id made from another (a batch's output file from the batch): the same each time it is made, so a
    finalisation done twice (a runner restarted in the middle) writes the same file, not a second one."""
    return prefix + hashlib.sha256(f"{of}\0{what}".encode()).hexdigest()[:32]


def valid_id(value: str, prefix: str) -> bool:
    return bool(_ID.match(value)) and value.startswith(prefix)


def owner_of(key_id: str | None) -> str:
    return key_id if key_id is not None else LOCAL_OWNER


def valid_owner(owner: str) -> bool:
    return bool(_OWNER.match(owner))
