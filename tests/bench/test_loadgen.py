"""bench/load/loadgen.py against a tiny fake SSE server (raw asyncio HTTP) that streams known chunks with
known delays. This checks the measuring tool, not the product."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from bench.load.loadgen import (
    RequestResult,
    chat_url,
    percentile,
    run_closed_loop,
    summarize,
)
from tests.support.fake_server import LocalServer

FIRST_DELAY = 0.20   # s before the first content chunk
GAP = 0.05           # s between content chunks
N_CHUNKS = 5


def chunk(content: str | None = None, finish: str | None = None) -> dict:
    delta = {} if content is None else {"content": content}
    return {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def usage_chunk(completion_tokens: int) -> dict:
    return {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [],
            "usage": {"prompt_tokens": 7, "completion_tokens": completion_tokens,
                      "total_tokens": 7 + completion_tokens}}


# scenario -> list of (delay before, SSE payload or None for "close the connection now")
def script(scenario: str, include_usage: bool) -> list[tuple[float, object]]:
    role = (0.0, {**chunk(), "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                          "finish_reason": None}]})
    content = [(FIRST_DELAY if i == 0 else GAP, chunk(f"t{i} ")) for i in range(N_CHUNKS)]
    if scenario == "ok":
        tail = [(0.0, chunk(finish="length"))]
        if include_usage:
            tail.append((0.0, usage_chunk(N_CHUNKS)))
        return [role, *content, *tail, (0.0, "[DONE]")]
    if scenario == "multi":   # 5 chunks that carry 2 tokens each, as the usage chunk says
        return [role, *content, (0.0, chunk(finish="stop")), (0.0, usage_chunk(2 * N_CHUNKS)),
                (0.0, "[DONE]")]
    if scenario == "cut":     # ends without finish_reason and without [DONE]
        return [role, *content[:3], (0.0, None)]
    if scenario == "nofinish":
        return [role, *content, (0.0, "[DONE]")]
    if scenario == "error":
        return [role, *content[:2], (0.0, {"error": {"message": "replica died", "type": "server_error",
                                                     "param": None, "code": "replica_unavailable"}}),
                (0.0, "[DONE]")]
    if scenario == "error_line":   # llama.cpp's server style: `error: {...}` instead of `data:`
        return [role, *content[:1], (0.0, "error_line")]
    raise AssertionError(scenario)


class FakeServer(LocalServer):
    """HTTP/1.1, one request per connection, `Connection: close`; the user message picks the scenario."""

    def __init__(self) -> None:
        self.requests: list[dict] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.decode().split("\r\n")[1:]:
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            body = json.loads(await reader.readexactly(length))
            self.requests.append(body)
            scenario = body["messages"][-1]["content"]
            if scenario == "http500":
                msg = b'{"error": {"message": "boom"}}'
                writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(msg), msg))
                await writer.drain()
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Cache-Control: no-cache\r\nConnection: close\r\n\r\n")
            await writer.drain()
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            for delay, payload in script(scenario, include_usage):
                if delay:
                    await asyncio.sleep(delay)
                if payload is None:
                    break
                if payload == "error_line":
                    writer.write(b'error: {"code": 500, "message": "boom", "type": "server_error"}\n\n')
                    continue
                data = payload if isinstance(payload, str) else json.dumps(payload)
                writer.write(f"data: {data}\n\n".encode())
                await writer.drain()
        finally:
            writer.close()


def run(coro):
    return asyncio.run(coro)


async def one(scenario: str, **kw) -> RequestResult:
    async with FakeServer() as srv:
        [res] = await run_closed_loop(srv.url, "m", 1, 1, [scenario], 64, **kw)
        return res


def test_ttft_itl_and_tokens_from_usage():
    res = run(one("ok"))
    assert res.ok and res.outcome == "ok" and res.status == 200
    assert res.got_done and res.finish_reason == "length"
    assert res.completion_tokens == N_CHUNKS and res.tokens_from_usage
    assert res.prompt_tokens == 7
    assert res.n_chunks == N_CHUNKS          # the empty role chunk is not content
    assert FIRST_DELAY - 0.01 <= res.ttft_s < FIRST_DELAY + 0.25
    assert res.ttft_s == res.content_times[0]
    assert GAP * 0.8 <= res.itl_s < GAP + 0.1
    assert all(GAP * 0.8 <= g < GAP + 0.15 for g in res.gaps_s)
    assert res.latency_s >= FIRST_DELAY + (N_CHUNKS - 1) * GAP - 0.01
    assert res.text_chars == len("".join(f"t{i} " for i in range(N_CHUNKS)))


def test_tokens_counted_from_deltas_without_usage():
    res = run(one("ok", include_usage=False))
    assert res.ok
    assert res.completion_tokens == N_CHUNKS and not res.tokens_from_usage


def test_itl_is_per_token_when_chunks_carry_several_tokens():
    res = run(one("multi"))
    assert res.ok and res.completion_tokens == 2 * N_CHUNKS and res.n_chunks == N_CHUNKS
    span = res.content_times[-1] - res.content_times[0]
    assert res.itl_s == pytest.approx(span / (2 * N_CHUNKS - 1))
    assert res.itl_s < GAP * 0.7


def test_stream_without_done_is_cut():
    res = run(one("cut"))
    assert not res.ok and res.outcome == "no_done" and not res.got_done
    assert res.n_chunks == 3 and res.completion_tokens == 3 and not res.tokens_from_usage
    assert res.ttft_s is not None


def test_stream_without_finish_reason_is_cut():
    res = run(one("nofinish"))
    assert res.outcome == "no_finish_reason" and res.got_done and not res.ok


def test_error_event_is_failed():
    res = run(one("error"))
    assert res.outcome == "error_event" and not res.ok
    assert "replica_unavailable" in res.error
    assert res.n_chunks == 2


def test_error_line_is_failed():
    res = run(one("error_line"))
    assert res.outcome == "error_event" and "boom" in res.error and res.n_chunks == 1


def test_http_error_is_failed():
    res = run(one("http500"))
    assert res.outcome == "http_error" and res.status == 500 and "boom" in res.error
    assert res.ttft_s is None and res.completion_tokens == 0


def test_connection_refused_is_failed():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    [res] = run(run_closed_loop(f"http://127.0.0.1:{port}", "m", 1, 1, ["ok"], 8))
    assert res.outcome == "connection_error" and not res.ok


def test_closed_loop_concurrency_order_prompts_and_seeds():
    async def go():
        async with FakeServer() as srv:
            t0 = asyncio.get_running_loop().time()
            results = await run_closed_loop(srv.url + "/v1", "m", 4, 8, ["ok", "ok", "cut"], 32,
                                            seed_base=100, temperature=0.5)
            return srv.requests, results, asyncio.get_running_loop().time() - t0

    requests, results, wall = run(go())
    assert [r.index for r in results] == list(range(8))
    assert [r.prompt_index for r in results] == [i % 3 for i in range(8)]
    assert sorted(q["seed"] for q in requests) == list(range(100, 108))
    q = requests[0]
    assert q["stream"] is True and q["max_tokens"] == 32 and q["temperature"] == 0.5
    assert q["stream_options"] == {"include_usage": True} and q["model"] == "m"
    # 8 requests of ~0.4 s, 4 at a time: about 2 rounds, far below 8 sequential ones
    assert wall < 8 * (FIRST_DELAY + (N_CHUNKS - 1) * GAP) * 0.75
    assert [r.outcome for r in results] == ["no_done" if i % 3 == 2 else "ok" for i in range(8)]


def test_percentile_linear_interpolation():
    xs = list(range(1, 11))
    assert percentile(xs, 50) == pytest.approx(5.5)
    assert percentile(xs, 95) == pytest.approx(9.55)
    assert percentile(xs, 0) == 1 and percentile(xs, 100) == 10
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 50) is None
    assert percentile([5, 1, 3], 50) == 3


def fake_result(i, ttft, tokens, span, outcome="ok", from_usage=True) -> RequestResult:
    times = [ttft + span * k / max(tokens - 1, 1) for k in range(tokens)]
    return RequestResult(index=i, prompt_index=0, start=0.0, end=ttft + span, outcome=outcome,
                         ttft_s=ttft, content_times=times, completion_tokens=tokens,
                         tokens_from_usage=from_usage, finish_reason="length")


def test_summarize():
    results = [fake_result(i, ttft=0.01 * (i + 1), tokens=11, span=1.0) for i in range(10)]
    results.append(fake_result(10, ttft=0.5, tokens=3, span=0.2, outcome="no_done", from_usage=False))
    s = summarize(results, wall_s=4.0)
    assert s["n_requests"] == 11 and s["n_ok"] == 10 and s["n_failed"] == 1
    assert s["outcomes"] == {"no_done": 1, "ok": 10}
    assert s["completion_tokens"] == 113 and s["tokens_per_s"] == pytest.approx(113 / 4)
    assert s["completion_tokens_source"] == "mixed"
    ttfts = [0.01 * (i + 1) for i in range(10)] + [0.5]
    assert s["ttft_ms"]["p50"] == pytest.approx(percentile(ttfts, 50) * 1000)
    assert s["ttft_ms"]["p95"] == pytest.approx(percentile(ttfts, 95) * 1000)
    assert s["ttft_ms"]["n"] == 11
    assert s["itl_ms"]["p50"] == pytest.approx(100.0)    # 1 s over 10 intervals
    assert s["requests_per_s"] == pytest.approx(11 / 4)
    assert summarize([], 1.0)["tokens_per_s"] == 0 and summarize([], 1.0)["ttft_ms"]["p50"] is None


def test_chat_url():
    assert chat_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert chat_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
