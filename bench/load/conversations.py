"""A multi-turn chat workload: conversations sharing one long system prompt, each turn sending the
whole history back (the assistant's previous replies included) plus a new user message, as chat
clients do. What it measures per request: TTFT and how much of the prompt the server reused from
its KV cache (`usage.prompt_tokens_details.cached_tokens / usage.prompt_tokens`).

`run_conversations()` runs `conversations` conversations of `turns` turns, `concurrency` of them at
a time (a conversation's turns are sequential: a turn starts when the previous reply has ended, after
a think time of `think_s` seconds times a seeded random factor in [0.5, 1.5), as a user reads before
answering; 0 sends it at once).
Turn t of conversation c is seeded `seed_base + 100 * c + t`, so runs against different servers or
routers send the same requests and, with the same seeds, get about the same replies.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from .loadgen import chat_payload, chat_url, percentile, stream_chat

_SUBJECTS = ("The archive", "Every visitor", "The night shift", "A careful reviewer", "The river crossing",
             "Our support team", "The weather station", "Each apprentice", "The old lighthouse", "The library",
             "A delivery drone", "The harbour office", "The greenhouse", "The orchestra", "A field geologist")
_VERBS = ("records", "checks", "explains", "measures", "repairs", "describes", "compares", "collects",
          "answers", "schedules", "labels", "inspects", "translates", "summarises", "protects")
_OBJECTS = ("the tide tables", "seven kinds of moss", "every broken lantern", "the winter timetable",
            "rare coins from the north", "the questions of new arrivals", "the temperature at noon",
            "the routes over the pass", "old maps of the valley", "the copper pipes", "forty jars of honey",
            "the signals from the ridge", "letters written in pencil", "the noise of the market",
            "the height of the snow")
_WHEN = ("before sunrise", "on rainy Tuesdays", "after the bell rings", "during the long holidays",
         "whenever the wind turns east", "at the end of each month", "while the ferry is late",
         "once the lamps are lit", "in the first week of spring", "when the river freezes")

TOPICS = ("bread baking", "tide pools", "bicycle repair", "star maps", "beekeeping", "glass blowing",
          "mountain weather", "paper making", "river ferries", "lighthouses")
FOLLOW_UPS = ("Tell me more about the first step.", "Why does that matter?", "What can go wrong there?",
              "Give a concrete example.", "How would a beginner practise it?", "Summarise what we said so far.",
              "What tools are needed?", "How long does it usually take?")


def shared_system_prompt(tokens: int = 1000, seed: int = 7) -> str:
    """A system prompt of about `tokens` tokens (at ~4.5 characters a token) built from varied
    sentences, so no tokenizer can squash it and no two sentences repeat in order."""
    rng = random.Random(seed)
    parts = ["You are the assistant of a small coastal town. Keep these facts in mind and answer briefly."]
    n = 0
    while sum(len(p) + 1 for p in parts) < tokens * 4.5:
        n += 1
        parts.append(f"Fact {n}: {rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} "
                     f"{rng.choice(_WHEN)}.")
    return " ".join(parts)


def user_message(conversation: int, turn: int) -> str:
    topic = TOPICS[conversation % len(TOPICS)]
    if turn == 0:
        return f"I am conversation {conversation}. Explain {topic} to me in a few sentences."
    return f"{FOLLOW_UPS[(conversation + turn) % len(FOLLOW_UPS)]} (about {topic}, turn {turn})"


@dataclass
class TurnResult:
    conversation: int
    turn: int
    outcome: str
    ttft_s: float | None
    latency_s: float
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


async def run_conversations(base_url: str, model: str, *, conversations: int = 8, turns: int = 6,
                            concurrency: int = 4, max_tokens: int = 96, temperature: float = 0.7,
                            seed_base: int = 0, system_prompt: str | Callable[[int], str] | None = None,
                            timeout_s: float = 300.0,
                            think_s: float = 0.0,
                            first_conversation: int = 0,
                            on_result: Callable[[TurnResult], None] | None = None,
                            client: httpx.AsyncClient | None = None) -> list[TurnResult]:
    """Results in (conversation, turn) order. A failed turn ends its conversation (its reply is
    missing, so the next turn has nothing to send back). `system_prompt`: one for every conversation
    (default: `shared_system_prompt()`), or conversation number -> its own."""
    if conversations < 0 or turns < 1 or concurrency < 1:
        raise ValueError("need conversations >= 0, turns >= 1 and concurrency >= 1")
    system = shared_system_prompt() if system_prompt is None else system_prompt
    system_of = system if callable(system) else (lambda _c: system)
    url = chat_url(base_url)
    own_client = client is None
    if client is None:
        client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0),
                                   limits=httpx.Limits(max_connections=concurrency + 4))
    results: list[TurnResult] = []
    queue = list(range(first_conversation, first_conversation + conversations))

    async def converse(c: int) -> None:
        messages: list[dict[str, str]] = [{"role": "system", "content": system_of(c)}]
        rng = random.Random(seed_base + 100 * c)
        for t in range(turns):
            if t and think_s > 0:
                await asyncio.sleep(think_s * rng.uniform(0.5, 1.5))
            messages.append({"role": "user", "content": user_message(c, t)})
            payload = chat_payload(model, "", max_tokens, temperature=temperature, seed=seed_base + 100 * c + t,
                                   extra={"messages": list(messages)})
            res = await stream_chat(client, url, payload, index=100 * c + t, prompt_index=c, keep_text=True)
            turn = TurnResult(c, t, res.outcome, res.ttft_s, res.latency_s, res.prompt_tokens, res.cached_tokens,
                              res.completion_tokens, res.error)
            results.append(turn)
            if on_result is not None:
                on_result(turn)
            if not res.ok:
                return
            messages.append({"role": "assistant", "content": res.text})

    async def worker() -> None:
        while queue:
            await converse(queue.pop(0))

    try:
        await asyncio.gather(*(worker() for _ in range(min(concurrency, max(conversations, 1)))))
    finally:
        if own_client:
            await client.aclose()
    return sorted(results, key=lambda r: (r.conversation, r.turn))


def summarize_turns(results: Sequence[TurnResult]) -> dict[str, Any]:
    """Cache hit ratio (sum of cached over sum of prompt tokens, over the turns that report both),
    TTFT percentiles in ms (all turns, and the follow-up turns alone), failures."""
    counted = [r for r in results if r.ok and r.prompt_tokens and r.cached_tokens is not None]
    prompt = sum(r.prompt_tokens or 0 for r in counted)
    cached = sum(r.cached_tokens or 0 for r in counted)

    def ms(values: list[float], q: float) -> float | None:
        v = percentile(values, q)
        return None if v is None else v * 1000

    ttft = [r.ttft_s for r in results if r.ok and r.ttft_s is not None]
    later = [r.ttft_s for r in results if r.ok and r.ttft_s is not None and r.turn > 0]
    return {
        "n_requests": len(results),
        "n_failed": sum(not r.ok for r in results),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cache_hit_ratio": cached / prompt if prompt else None,
        "ttft_p50_ms": ms(ttft, 50),
        "ttft_p95_ms": ms(ttft, 95),
        "ttft_mean_ms": sum(ttft) / len(ttft) * 1000 if ttft else None,
        "followup_ttft_p50_ms": ms(later, 50),
        "errors": sorted({r.error for r in results if r.error})[:5],
    }
