"""bench/load/conversations.py against a fake SSE server that answers every turn with a known reply and
known usage: the histories sent back, the concurrency, the cache ratio and TTFT arithmetic."""

from __future__ import annotations

import asyncio
import json

import pytest

from bench.load.conversations import (
    TurnResult,
    run_conversations,
    shared_system_prompt,
    summarize_turns,
    user_message,
)
from tests.support.fake_server import LocalServer


class ChatFake(LocalServer):
    """One request per connection. The reply names the request; usage says 100 prompt tokens, 75 of
    them cached after the first turn. A user message containing 'FAIL' gets a 500."""

    def __init__(self, delay: float = 0.02) -> None:
        self.requests: list[dict] = []
        self.delay = delay
        self.active = self.most_active = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(":", 1)[1]) for line in head.decode().split("\r\n")
                          if line.lower().startswith("content-length:"))
            body = json.loads(await reader.readexactly(length))
            self.requests.append(body)
            if "FAIL" in body["messages"][-1]["content"]:
                writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
            await asyncio.sleep(self.delay)
            turn = sum(m["role"] == "user" for m in body["messages"]) - 1
            reply = f"reply seed={body['seed']}"
            for i, piece in enumerate((reply[:5], reply[5:])):
                writer.write(f"data: {json.dumps(chunk(piece))}\n\n".encode())
            writer.write(f"data: {json.dumps(chunk(None, 'stop'))}\n\n".encode())
            usage = {"prompt_tokens": 100, "completion_tokens": 2, "total_tokens": 102,
                     "prompt_tokens_details": {"cached_tokens": 75 if turn else 0}}
            writer.write(f"data: {json.dumps({**chunk(None), 'choices': [], 'usage': usage})}\n\n".encode())
            writer.write(b"data: [DONE]\n\n")
            await writer.drain()
        finally:
            self.active -= 1
            writer.close()


def chunk(content: str | None, finish: str | None = None) -> dict:
    delta = {} if content is None else {"content": content}
    return {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_system_prompt_is_long_varied_and_stable():
    text = shared_system_prompt(1000)
    assert 4500 <= len(text) < 4700
    facts = text.split("Fact ")[1:]
    assert len({f.split(":", 1)[1] for f in facts}) > 0.9 * len(facts)  # sentences vary
    assert shared_system_prompt(1000) == text and shared_system_prompt(200) != text


def test_each_turn_sends_the_whole_history_back():
    async def go():
        async with ChatFake() as fake:
            results = await run_conversations(fake.url, "m", conversations=3, turns=4, concurrency=2,
                                              system_prompt="SYSTEM", seed_base=1000)
            return fake, results

    fake, results = asyncio.run(go())
    assert [(r.conversation, r.turn) for r in results] == [(c, t) for c in range(3) for t in range(4)]
    assert all(r.ok and r.prompt_tokens == 100 for r in results)
    assert fake.most_active <= 2
    last = next(b for b in fake.requests if b["seed"] == 1000 + 100 * 2 + 3)  # conversation 2, turn 3
    msgs = last["messages"]
    assert msgs[0] == {"role": "system", "content": "SYSTEM"}
    assert [m["role"] for m in msgs[1:]] == ["user", "assistant"] * 3 + ["user"]
    assert [m["content"] for m in msgs[2::2]] == [f"reply seed={1000 + 200 + t}" for t in range(3)]
    assert [m["content"] for m in msgs[1::2]] == [user_message(2, t) for t in range(4)]
    assert last["stream"] is True and last["stream_options"] == {"include_usage": True}


def test_each_conversation_can_have_its_own_system_prompt():
    async def go():
        async with ChatFake() as fake:
            await run_conversations(fake.url, "m", conversations=3, turns=2, concurrency=3,
                                    system_prompt=lambda c: f"DOC {c}", seed_base=1000)
            return fake

    fake = asyncio.run(go())
    by_seed = {b["seed"]: b["messages"][0] for b in fake.requests}
    for c in range(3):
        for t in range(2):
            assert by_seed[1000 + 100 * c + t] == {"role": "system", "content": f"DOC {c}"}


def test_summary_ratio_and_ttft():
    async def go():
        async with ChatFake(delay=0.05) as fake:
            return await run_conversations(fake.url, "m", conversations=2, turns=3, concurrency=2)

    s = summarize_turns(asyncio.run(go()))
    # 6 turns of 100 prompt tokens; the 4 follow-ups had 75 cached
    assert (s["n_requests"], s["n_failed"], s["prompt_tokens"], s["cached_tokens"]) == (6, 0, 600, 300)
    assert s["cache_hit_ratio"] == pytest.approx(0.5)
    assert 50 <= s["ttft_p50_ms"] < 1000 and s["ttft_p95_ms"] >= s["ttft_p50_ms"]
    assert 50 <= s["ttft_mean_ms"] <= s["ttft_p95_ms"] + 1


def test_a_failed_turn_ends_its_conversation(monkeypatch):
    import bench.load.conversations as conv

    monkeypatch.setattr(conv, "user_message", lambda c, t: "FAIL" if (c, t) == (1, 1) else f"hi {c} {t}")

    async def go():
        async with ChatFake() as fake:
            return await run_conversations(fake.url, "m", conversations=2, turns=3, concurrency=2)

    results = asyncio.run(go())
    assert [(r.conversation, r.turn, r.ok) for r in results] == [
        (0, 0, True), (0, 1, True), (0, 2, True), (1, 0, True), (1, 1, False)]
    assert results[-1].outcome == "http_error"
    assert summarize_turns(results)["n_failed"] == 1


def test_think_time_waits_between_turns_only():
    import time

    async def go(think):
        async with ChatFake(delay=0.0) as fake:
            t0 = time.perf_counter()
            await run_conversations(fake.url, "m", conversations=1, turns=3, think_s=think)
            return time.perf_counter() - t0

    quick, thinking = asyncio.run(go(0.0)), asyncio.run(go(0.4))
    assert thinking - quick >= 2 * 0.4 * 0.5 - 0.05  # two pauses (none before the first turn), each >= 0.2 s
    assert thinking - quick < 2 * 0.4 * 1.5 + 0.5


def test_summary_without_cache_reports():
    r = TurnResult(0, 0, "ok", 0.1, 0.2, 50, None, 3)
    assert summarize_turns([r])["cache_hit_ratio"] is None
