"""One stored entry: a sequence's state (`<name>.kv`, llama.cpp's bytes as they are) and its index record
(`<name>.idx`, small JSON: the model key and scope it belongs to, the tokens its KV holds, the payload's size and
sha256). An entry is found by its index record, whose tokens are compared with a prompt's token by token; its
payload is used only after its size and checksum match the record and the record's key and scope match the
reader's. The name is a digest of the key, the scope and the tokens, so replicas that save the same prefix write
the same entry (whichever write lands last, both are the same good bytes)."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from dataclasses import dataclass

import numpy as np

from .key import FORMAT

MAX_INDEX_BYTES = 16 << 20  # an index record larger than this is not ours (a context of 4M tokens)


class EntryError(ValueError):
    """An entry that must not be used (truncated, corrupted, another model's or scope's, not ours at all): removed."""


@dataclass(frozen=True)
class IndexRecord:
    name: str
    key: str
    scope: str
    tokens: np.ndarray  # int32, what the payload's KV holds, in order
    size: int
    sha256: str
    created: float


def entry_name(key: str, scope: str, tokens: np.ndarray) -> str:
    h = hashlib.sha256(f"{key}/{scope}/".encode())
    h.update(np.ascontiguousarray(tokens, dtype="<i4").tobytes())
    return h.hexdigest()[:40]


def index_record(key: str, scope: str, tokens: np.ndarray, payload: bytes | memoryview) -> IndexRecord:
    tokens = np.ascontiguousarray(tokens, dtype=np.int32)
    return IndexRecord(entry_name(key, scope, tokens), key, scope, tokens, len(payload),
                       hashlib.sha256(payload).hexdigest(), time.time())


def encode_index(record: IndexRecord) -> bytes:
    return json.dumps({"format": FORMAT, "name": record.name, "key": record.key, "scope": record.scope,
                       "tokens": base64.b64encode(record.tokens.astype("<i4").tobytes()).decode(),
                       "size": record.size, "sha256": record.sha256, "created": record.created}).encode()


def decode_index(data: bytes, key: str, scope: str | None = None) -> IndexRecord:
    """The record in `data`, if it is a well-formed record of this `key` (and `scope`, when given); else EntryError."""
    if len(data) > MAX_INDEX_BYTES:
        raise EntryError("index record too large")
    try:
        raw = json.loads(data)
        tokens = np.frombuffer(base64.b64decode(raw["tokens"], validate=True), dtype="<i4").astype(np.int32)
        record = IndexRecord(str(raw["name"]), str(raw["key"]), str(raw["scope"]), tokens, int(raw["size"]),
                             str(raw["sha256"]), float(raw["created"]))
        fmt = raw["format"]
    except (ValueError, KeyError, TypeError) as exc:
        raise EntryError(f"unreadable index record: {exc}") from None
    if fmt != FORMAT or record.key != key or (scope is not None and record.scope != scope):
        raise EntryError("an index record of another model, format or scope")
    if record.name != entry_name(record.key, record.scope, tokens) or record.size <= 0 or len(tokens) == 0:
        raise EntryError("an index record that does not describe its own name")
    return record


def check_payload(record: IndexRecord, payload: bytes) -> None:
    """EntryError unless `payload` is exactly the state the record describes (a write cut short, a flipped bit)."""
    if len(payload) != record.size:
        raise EntryError(f"payload of {len(payload)} bytes, its record says {record.size}")
    if hashlib.sha256(payload).hexdigest() != record.sha256:
        raise EntryError("payload checksum does not match its record")
