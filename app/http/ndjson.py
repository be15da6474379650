"""Ollama's stream framing: newline-delimited JSON (`application/x-ndjson`), one record per line, no closing line;
an error under way is one `{"error": ...}` line, as Ollama's clients read it.

NDJSON has no comment line, and Ollama's clients parse every line (the `ollama` package's `json.loads` fails on a
blank one), so a keep-alive (a stream waiting for a slot, a cold pooled model, hidden reasoning: app/http/
keepalive.py) is a record that adds nothing: an empty `message` for /api/chat's readers and an empty `response` for
/api/generate's, `done: false`, in one line both read."""

from __future__ import annotations

from typing import Any

from ..api import strict_json
from .sse import SSEDialect

MEDIA_TYPE = "application/x-ndjson"


def encode_line(record: dict[str, Any]) -> bytes:
    return strict_json.dumps_bytes(record) + b"\n"


KEEPALIVE_LINE = encode_line({"message": {"role": "assistant", "content": ""}, "response": "", "done": False})


NDJSON = SSEDialect(encode=encode_line, keepalive=KEEPALIVE_LINE, done=None, waiting=KEEPALIVE_LINE,
                    media_type=MEDIA_TYPE)
