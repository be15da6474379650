"""A reply's generation, in rounds: a tool call that `max_tokens` cut inside its JSON is continued
(bounded rounds, within the context) so the client gets a whole call. Continuation rounds are folded
into the one reply: one `Started`, one `Finished`, the usage of all rounds."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from ..engine.events import Event, Finished, Started, Text
from ..engine.params import GenerationRequest
from ..errors import APIError, timeout_error
from ..parsers import ReplyParser
from .plan import GenerationPlan
from .tally import ReplyTally

OpenStream = Callable[[str, GenerationRequest], AsyncIterator[list[Event]]]
"""How a reply reaches a model: a Ray handle in production, an engine or a fake in tests."""

# Tokens kept free when a cut tool call is continued: the prompt plus the reply so far is tokenized
# anew, and the reply's text may not give back exactly the tokens that produced it.
CONTINUATION_MARGIN = 16


async def reply_events(open_stream: OpenStream, plan: GenerationPlan, parser: ReplyParser, tally: ReplyTally,
                       timeout_s: float, first: AsyncIterator[list[Event]] | None = None) -> AsyncIterator[list[Event]]:
    """The reply's events, recorded in `tally`, until it finishes or `timeout_s` passes (504).
    `first`: the first round's events when they are already flowing (one choice of several)."""
    deadline = time.monotonic() + timeout_s
    gen, rounds = plan.gen, 0
    while gen is not None:
        events = first if first is not None else open_stream(plan.spec.id, gen)
        first, gen = None, None
        async for batch in with_deadline(events, deadline, timeout_s):
            out = []
            for ev in batch:
                if isinstance(ev, Started):
                    if tally.started:
                        continue  # a continuation round
                    tally.start(ev)
                elif isinstance(ev, Text):
                    tally.add_text(ev.text)
                elif isinstance(ev, Finished):
                    tally.end_round(ev)
                    gen = _next_round(plan, parser, tally, ev, rounds)
                    if gen is not None:
                        rounds += 1
                        continue  # the reply goes on: this round's end is not the reply's
                    tally.finish_reason = ev.finish_reason
                out.append(ev)
            if out:
                yield out
        if gen is None and tally.finish_reason is None:
            raise APIError("The model stream ended without finishing.", status=502, type="server_error",
                           code="incomplete_generation")


def _next_round(plan: GenerationPlan, parser: ReplyParser, tally: ReplyTally, ended: Finished,
                rounds: int) -> GenerationRequest | None:
    """The continuation of a reply whose tool call `max_tokens` cut, or None when it is done."""
    if ended.finish_reason != "length" or not plan.tool_parser or rounds >= plan.spec.tool_continuation_rounds:
        return None
    room = continuation_room(plan, tally)
    if room <= 0:
        return None
    text = tally.text()
    return continuation(plan, text, room) if parser.has_open_call(text) else None


def continuation(plan: GenerationPlan, text: str, max_tokens: int) -> GenerationRequest:
    """The next round: prompt + everything generated (its KV prefix is reused), and a forced call's
    grammar resumed after the text it already produced."""
    return replace(plan.gen, request_id=uuid.uuid4().hex, prompt=plan.gen.prompt + text, max_tokens=max_tokens, n=1,
                   sampling=replace(plan.gen.sampling, grammar_prefix=text))


def continuation_room(plan: GenerationPlan, tally: ReplyTally) -> int:
    """Tokens a continuation round may generate: its budget, within what is left of the context.
    0: no room, the reply ends with `length`."""
    left = plan.spec.n_ctx - tally.prompt_tokens - tally.completion_tokens - CONTINUATION_MARGIN
    return max(0, min(plan.spec.tool_continuation_tokens, left))


async def with_deadline(events: AsyncIterator[Any], deadline: float, timeout_s: float) -> AsyncIterator[Any]:
    """Iterate `events` until `deadline` (monotonic); then stop it and raise a 504 APIError.
    Closing the source cancels the generation, so a stuck request frees its slot."""
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise timeout_error(timeout_s)
            try:
                item = await asyncio.wait_for(anext(events), remaining)
            except StopAsyncIteration:
                return
            except asyncio.TimeoutError:
                raise timeout_error(timeout_s) from None
            yield item
    finally:
        await events.aclose()
