"""Server-sent events framing, one `SSEDialect` per protocol.

OpenAI's chat and legacy completions streams are bare `data:` lines ended by exactly one `data: [DONE]`,
whatever happened before it (a finished stream, an error event, a producer that stopped without a finish
chunk), and a keep-alive `TICK` (app/http/keepalive.py) is a `: keep-alive` comment, which SSE clients
skip. The agent protocols (OpenAI Responses, Anthropic Messages) name each event after its `type` in an
`event:` line and send no [DONE]; Anthropic's keep-alive is a `ping` event its SDK expects, but only
after `message_start`: Anthropic's stream opens with it and strict clients refuse anything before it, so
a stream still waiting for its first event (queued behind busy slots) is kept alive by SSE comments,
which every client skips.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from ..api import strict_json
from .keepalive import Tick

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}


def encode_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + strict_json.dumps_bytes(payload) + b"\n\n"


def encode_named_event(payload: dict[str, Any]) -> bytes:
    """`event: <type>` then the data line: clients of the typed-event protocols dispatch on the name."""
    return b"event: " + str(payload.get("type", "message")).encode() + b"\n" + encode_event(payload)


@dataclass(frozen=True)
class SSEDialect:
    """How one protocol frames its stream: each event, the keep-alive once its first event is out and before
    (`waiting`: an SSE comment, which every SSE client skips), the closing line (None: none), and the stream's
    media type (Ollama's NDJSON is framed this way too: app/http/ndjson.py)."""

    encode: Callable[[dict[str, Any]], bytes] = encode_event
    keepalive: bytes = KEEPALIVE
    done: bytes | None = DONE
    waiting: bytes = KEEPALIVE
    media_type: str = "text/event-stream"


OPENAI_CHAT = SSEDialect()
TYPED_EVENTS = SSEDialect(encode=encode_named_event, done=None)
# llama-server's own streams (/infill): bare `data:` lines, the last one the whole object (`stop: true`), no [DONE].
LLAMA_SERVER = SSEDialect(done=None)
ANTHROPIC_MESSAGES = SSEDialect(encode=encode_named_event, keepalive=b'event: ping\ndata: {"type": "ping"}\n\n',
                                done=None)


async def frame_stream(events: AsyncIterable[list[dict[str, Any]] | Tick], on_error,
                       dialect: SSEDialect = OPENAI_CHAT) -> AsyncIterator[bytes]:
    """Encode batches of event dicts as SSE (a tick as the dialect's keep-alive); an exception becomes one
    error event; then the dialect's closing line.

    `on_error(exc)` returns the protocol's error event for an exception raised by `events`.
    """
    opened = False  # the protocol's first event is out: from then on its own keep-alive
    try:
        async for batch in events:
            if isinstance(batch, Tick):
                yield dialect.keepalive if opened else dialect.waiting
            elif batch:
                opened = True
                yield b"".join(dialect.encode(chunk) for chunk in batch)
    except Exception as exc:  # noqa: BLE001 - every failure must reach the client as an event
        yield dialect.encode(on_error(exc))
    if dialect.done is not None:
        yield dialect.done
