"""Server-sent events framing for chat completion streams.

The protocol ends with exactly one `data: [DONE]`, whatever happened before it: a finished
stream, an error event, or a producer that stopped without a finish chunk. A `TICK` (app/http/keepalive.py)
becomes a `: keep-alive` comment line, which SSE clients (the openai SDK included) skip.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from .keepalive import Tick

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}


def encode_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


async def frame_stream(events: AsyncIterable[list[dict[str, Any]] | Tick], on_error) -> AsyncIterator[bytes]:
    """Encode batches of chunk dicts as SSE (a tick as a comment); an exception becomes one error
    event; then [DONE].

    `on_error(exc)` returns the OpenAI error body for an exception raised by `events`.
    """
    try:
        async for batch in events:
            if isinstance(batch, Tick):
                yield KEEPALIVE
            elif batch:
                yield b"".join(encode_event(chunk) for chunk in batch)
    except Exception as exc:  # noqa: BLE001 - every failure must reach the client as an event
        yield encode_event(on_error(exc))
    yield DONE
