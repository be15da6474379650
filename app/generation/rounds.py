"""A reply's generation, in rounds: a tool call that `max_tokens` cut inside its JSON is continued
(bounded rounds, within the context) so the client gets a whole call. Continuation rounds are folded
into the one reply: one `Started`, one `Finished`, the usage of all rounds.

A round continues from the token ids generated so far (the model returns them when planning asked,
GenerationRequest.return_tokens), never from their text: re-tokenizing the text would turn generated
text that spells a control token into that token, and could give other tokens than the ones whose KV
the model holds."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from ..api.errors import APIError, timeout_error
from ..engine.events import Event, Finished, Started, Text
from ..engine.params import GenerationRequest
from ..parsers import ReplyParser
from .plan import GenerationPlan
from .tally import ReplyTally

Generate = Callable[[str, GenerationRequest], AsyncIterator[list[Event]]]
"""How a reply reaches a model: a Ray handle in production, an engine or a fake in tests."""


async def reply_events(generate: Generate, plan: GenerationPlan, parser: ReplyParser, tally: ReplyTally,
                       timeout_s: float, first: AsyncIterator[list[Event]] | None = None) -> AsyncIterator[list[Event]]:
    """The reply's events, recorded in `tally`, until it finishes or `timeout_s` passes (504).
    `first`: the first round's events when they are already flowing (one choice of several)."""
    deadline = time.monotonic() + timeout_s
    gen, rounds = plan.gen, 0
    generated: list[int] = []  # the reply's token ids, over its rounds
    while gen is not None:
        events = first if first is not None else generate(plan.spec.id, gen)
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
                    generated.extend(ev.token_ids)
                    gen = _next_round(plan, parser, tally, ev, rounds, generated)
                    if gen is not None:
                        rounds += 1
                        continue  # the reply goes on: this round's end is not the reply's
                    tally.finish_reason, tally.stop_sequence = ev.finish_reason, ev.stop_sequence
                out.append(ev)
            if out:
                yield out
        if gen is None and tally.finish_reason is None:
            raise APIError("The model stream ended without finishing.", status=502, type="server_error",
                           code="incomplete_generation")


def _next_round(plan: GenerationPlan, parser: ReplyParser, tally: ReplyTally, ended: Finished,
                rounds: int, generated: list[int]) -> GenerationRequest | None:
    """The continuation of a reply whose tool call `max_tokens` cut, or None when it is done."""
    if ended.finish_reason != "length" or not plan.tool_parser or rounds >= plan.spec.tool_continuation_rounds:
        return None
    if len(generated) != tally.completion_tokens:
        return None  # the model did not return the reply's ids: it cannot be continued exactly
    room = continuation_room(plan, tally)
    if room <= 0:
        return None
    return continuation(plan, generated, room) if parser.has_open_call(tally.text()) else None


def continuation(plan: GenerationPlan, generated: list[int], max_tokens: int) -> GenerationRequest:
    """The next round: the same prompt followed by the ids generated so far (their KV prefix is reused
    exactly), a forced call's grammar resumed after them. It reuses that KV even for a request that asked
    for no cached prefix (`cache_prompt` false): it is the same reply going on, and only its own KV gives
    the next token the logits an uncut generation would have had."""
    return replace(plan.gen, request_id=uuid.uuid4().hex, continue_tokens=[*plan.gen.continue_tokens, *generated],
                   max_tokens=max_tokens, n=1, cache_prompt=True)


def continuation_room(plan: GenerationPlan, tally: ReplyTally) -> int:
    """Tokens a continuation round may generate: its budget, within what is left of the context (the
    next round's prompt is exactly the prompt's tokens and the ones generated). 0: no room, the reply
    ends with `length`."""
    left = plan.spec.n_ctx - tally.prompt_tokens - tally.completion_tokens
    return max(0, min(plan.spec.tool_continuation_tokens, left))


class _Deadline:
    """A reply's deadline as one timer: when it fires it cancels the reader's task only while that task waits for
    the source (never the reader's own code after a yield); otherwise the next wait finds it expired."""

    __slots__ = ("task", "waiting", "expired", "fired")

    def __init__(self) -> None:
        self.task: asyncio.Task | None = None
        self.waiting = self.expired = self.fired = False

    def expire(self) -> None:
        self.expired = True
        if self.waiting and self.task is not None:
            self.fired = True
            self.task.cancel()


async def with_deadline(events: AsyncIterator[Any], deadline: float, timeout_s: float) -> AsyncIterator[Any]:
    """Iterate `events` until `deadline` (monotonic); then stop it and raise a 504 APIError.
    Closing the source cancels the generation, so a stuck request frees its slot.

    One timer per reply, armed once: `asyncio.timeout` around each item armed and cancelled a timer for every
    item, and `wait_for` ran every item in a task of its own, each in turn the largest of the ChatProcessor's own
    per-chunk costs (docs/history/benchmarks-2026.md)."""
    state = _Deadline()
    timer = asyncio.get_running_loop().call_later(max(0.0, deadline - time.monotonic()), state.expire)
    try:
        while True:
            if state.expired or deadline <= time.monotonic():
                raise timeout_error(timeout_s)
            state.task, state.waiting = asyncio.current_task(), True
            try:
                item = await anext(events)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                # Ours, and no one else's cancellation pending: the deadline. Anyone else's stays a cancellation.
                if state.fired and state.task is not None and state.task.uncancel() == 0:
                    raise timeout_error(timeout_s) from None
                raise
            finally:
                state.waiting = False
            yield item
    finally:
        timer.cancel()
        await events.aclose()
