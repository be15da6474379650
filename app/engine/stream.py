"""Bridge the engine thread to asyncio, coalescing pieces so Ray hops stay cheap.

The first text piece goes out at once (time to first token); after that, pieces that arrive
within the coalescing window travel together. The window grows with the number of sequences
the engine is decoding (`PER_STREAM_S` each): every item costs about a millisecond of CPU per
Ray hop, and that CPU is taken from llama.cpp's threads, so the replica's total item rate stays
roughly constant however many streams it serves. Each item yielded is a list of events:
{"type": "start", prompt_tokens, cached_tokens} | {"type": "text", text, tokens} |
{"type": "end", finish_reason, prompt_tokens, completion_tokens, cached_tokens}.
An engine error is raised as APIError. Closing the generator early cancels the request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from ..errors import APIError
from .engine import LlamaEngine, QueueSink
from .params import GenerationRequest


PER_STREAM_S = 0.015
MAX_WINDOW_S = 0.5


def coalescing_window(base_s: float, active: int) -> float:
    return min(MAX_WINDOW_S, max(base_s, active * PER_STREAM_S))


async def generate_stream(engine: LlamaEngine, req: GenerationRequest, interval_s: float) -> AsyncIterator[list[dict[str, Any]]]:
    queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
    seq = engine.prepare(req, QueueSink(asyncio.get_running_loop(), queue))  # raises APIError for bad input, before queueing
    engine.submit(seq)
    finished = False
    sent_text = False
    last_yield = 0.0
    try:
        while not finished:
            events = [await queue.get()]
            if sent_text and interval_s > 0:
                delay = last_yield + coalescing_window(interval_s, engine.active) - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            while not queue.empty():
                events.append(queue.get_nowait())
            out: list[dict[str, Any]] = []
            for ev in events:
                kind = ev[0]
                if kind == "text":
                    if out and out[-1]["type"] == "text":
                        out[-1]["text"] += ev[1]
                        out[-1]["tokens"] += ev[2]
                    else:
                        out.append({"type": "text", "text": ev[1], "tokens": ev[2]})
                    sent_text = True
                elif kind == "start":
                    out.append({"type": "start", **ev[1]})
                elif kind == "end":
                    out.append({"type": "end", **ev[1]})
                    finished = True
                elif kind == "error":
                    finished = True
                    if out:
                        yield out
                    err = ev[1]
                    raise err if isinstance(err, APIError) else APIError(str(err))
            last_yield = time.monotonic()
            yield out
    finally:
        if not finished:
            # Client gone or the caller stopped reading: free the slot on the next step.
            engine.cancel(req.request_id)
