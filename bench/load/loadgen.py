"""Load generator for OpenAI-compatible streaming chat completions (pure Python, httpx, no Ray).

One request = one streamed `POST /v1/chat/completions`; `stream_chat()` measures it into a
`RequestResult`:

- TTFT: from sending the request to the first SSE chunk with non-empty `delta.content`.
- Inter-token latency: `(last_content_time - first_content_time) / (completion_tokens - 1)`.
  Servers put different numbers of tokens in a chunk, so the gaps between chunks
  (`RequestResult.gaps_s`) are reported too but are not per-token numbers.
- Completion tokens: from the `usage` chunk (`stream_options.include_usage`) when the server
  sends one, else the number of content deltas (`tokens_from_usage` is False then).
- Outcome: `ok` only for HTTP 200, no `error` event, a `finish_reason`, and `data: [DONE]`;
  everything else is a failed or cut stream (see `OUTCOMES`).

`run_closed_loop()` keeps `concurrency` requests in flight until `n_requests` are done;
`summarize()` turns results into one dict of aggregates and percentiles.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

# Outcomes of one request. Everything except "ok" counts as failed or cut.
OUTCOMES = (
    "ok",
    "http_error",        # status != 200
    "connection_error",  # connect failure, or the connection dropped mid-stream
    "timeout",
    "error_event",       # `data: {"error": ...}` in the stream
    "bad_event",         # a data payload that is not JSON
    "no_done",           # the stream ended without `data: [DONE]`
    "no_finish_reason",  # [DONE] came, but no choice had a finish_reason
)

# Prompts that ask for long answers, so that most requests run to max_tokens.
DEFAULT_PROMPTS: tuple[str, ...] = (
    "Write a detailed essay about the history of the printing press and its effects on Europe.",
    "Explain step by step how a refrigerator works, covering every component.",
    "Describe in detail a day in the life of a medieval blacksmith.",
    "Write a long story about a robot who learns to paint.",
    "Explain the water cycle in depth, with examples from different climates.",
    "Give a thorough guide to planting and caring for a vegetable garden.",
    "Describe the causes and consequences of the French Revolution in detail.",
    "Write a long letter from a sailor to his family describing a voyage across the ocean.",
    "Explain how the internet works, from cables to web pages, in detail.",
    "Write a detailed travel guide for a week in Japan.",
    "Explain photosynthesis thoroughly, including the light and dark reactions.",
    "Tell a long fairy tale about a dragon and a clever shepherd girl.",
    "Describe how to train for a first marathon over six months, week by week.",
    "Explain the theory of evolution by natural selection with many examples.",
    "Write a detailed review of an imaginary science fiction novel.",
    "Describe the solar system planet by planet, with facts about each one.",
    "Explain how to bake bread from scratch, describing every step and why it matters.",
    "Write a long dialogue between a teacher and a student about the meaning of friendship.",
    "Describe the life cycle of a star, from nebula to its final stage, in detail.",
    "Explain the rules and strategy of chess to a complete beginner.",
    "Write an in-depth history of the Roman Empire from its founding to its fall.",
    "Describe how a city could prepare for a major flood, covering many measures.",
    "Write a long poem about the changing seasons in a mountain village.",
    "Explain how vaccines train the immune system, in detail.",
    "Give detailed advice for someone starting their first job in an office.",
    "Describe the process of making a movie, from script to cinema.",
    "Write a detailed account of the first voyage to the Moon.",
    "Explain the basics of economics: supply, demand, prices and markets, with examples.",
    "Write a long adventure story set in a jungle full of ancient ruins.",
    "Describe the architecture of Gothic cathedrals and how they were built.",
    "Explain how computers store and process information, from bits to programs.",
    "Write a detailed plan for organizing a community festival in a small town.",
)


@dataclass
class RequestResult:
    """One streamed request. Times are seconds; `start`/`end` are `time.perf_counter()` values,
    `content_times` offsets from `start` of each chunk that carried content."""

    index: int
    prompt_index: int
    start: float
    end: float = 0.0
    outcome: str = "ok"
    status: int | None = None
    error: str | None = None
    ttft_s: float | None = None
    content_times: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    tokens_from_usage: bool = False
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, when the server sends it
    finish_reason: str | None = None
    got_done: bool = False
    text_chars: int = 0
    text: str = ""  # the content itself, only when asked for (keep_text: multi-turn workloads)

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def latency_s(self) -> float:
        return self.end - self.start

    @property
    def n_chunks(self) -> int:
        return len(self.content_times)

    @property
    def itl_s(self) -> float | None:
        """Mean time per output token after the first: a per-token number whatever the chunking."""
        if self.n_chunks < 2 or self.completion_tokens < 2:
            return None
        return (self.content_times[-1] - self.content_times[0]) / (self.completion_tokens - 1)

    @property
    def gaps_s(self) -> list[float]:
        """Gaps between consecutive content chunks (a chunk may carry several tokens)."""
        t = self.content_times
        return [b - a for a, b in zip(t, t[1:])]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(ok=self.ok, latency_s=self.latency_s, itl_s=self.itl_s)
        return d


def chat_payload(model: str, prompt: str, max_tokens: int, *, temperature: float = 0.7,
                 seed: int | None = None, include_usage: bool = True,
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
    }
    if seed is not None:
        payload["seed"] = seed
    if include_usage:
        payload["stream_options"] = {"include_usage": True}
    if extra:
        payload.update(extra)
    return payload


async def stream_chat(client: httpx.AsyncClient, url: str, payload: dict[str, Any], *,
                      index: int = 0, prompt_index: int = 0,
                      on_start: Callable[[RequestResult], None] | None = None,
                      keep_text: bool = False) -> RequestResult:
    """Send one streaming chat request to `url` (the full .../chat/completions URL) and measure it.
    Never raises for server or network failures: they become the result's `outcome`.
    `on_start` gets the result object before the request is sent; it is filled in place as chunks
    arrive (`ttft_s`, `content_times`), so live displays can read a stream still running.
    `keep_text` keeps the streamed content in `text` (to send it back in a conversation's next turn)."""
    res = RequestResult(index=index, prompt_index=prompt_index, start=time.perf_counter())
    if on_start is not None:
        on_start(res)
    n_deltas = 0
    usage_tokens: int | None = None
    try:
        async with client.stream("POST", url, json=payload) as resp:
            res.status = resp.status_code
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                res.outcome, res.error = "http_error", f"HTTP {resp.status_code}: {body[:300]}"
                return res
            async for data in _sse_data(resp):
                now = time.perf_counter()
                if data == "[DONE]":
                    res.got_done = True
                    break
                try:
                    event = json.loads(data)
                except json.JSONDecodeError:
                    res.outcome, res.error = "bad_event", f"not JSON: {data[:200]}"
                    continue
                if not isinstance(event, dict):
                    res.outcome, res.error = "bad_event", f"not an object: {data[:200]}"
                    continue
                if event.get("error") is not None:
                    res.outcome, res.error = "error_event", json.dumps(event["error"])[:300]
                    continue
                for choice in event.get("choices") or ():
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        if res.ttft_s is None:
                            res.ttft_s = now - res.start
                        res.content_times.append(now - res.start)
                        res.text_chars += len(content)
                        if keep_text:
                            res.text += content
                        n_deltas += 1
                    if choice.get("finish_reason"):
                        res.finish_reason = choice["finish_reason"]
                usage = event.get("usage")
                if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
                    usage_tokens = int(usage["completion_tokens"])
                    if usage.get("prompt_tokens") is not None:
                        res.prompt_tokens = int(usage["prompt_tokens"])
                    details = usage.get("prompt_tokens_details")
                    if isinstance(details, dict) and details.get("cached_tokens") is not None:
                        res.cached_tokens = int(details["cached_tokens"])
    except httpx.TimeoutException as exc:
        res.outcome, res.error = "timeout", f"{type(exc).__name__}: {exc}"
    except (httpx.HTTPError, OSError) as exc:
        res.outcome, res.error = "connection_error", f"{type(exc).__name__}: {exc}"
    finally:
        res.end = time.perf_counter()
        if usage_tokens is not None:
            res.completion_tokens, res.tokens_from_usage = usage_tokens, True
        else:
            res.completion_tokens = n_deltas
    if res.outcome == "ok":
        if not res.got_done:
            res.outcome, res.error = "no_done", "stream ended without data: [DONE]"
        elif res.finish_reason is None:
            res.outcome, res.error = "no_finish_reason", "no choice had a finish_reason"
    return res


async def _sse_data(resp: httpx.Response):
    """The `data` payloads of an SSE response (multi-line data joined with newlines). A line
    `error: ...` (llama.cpp's server reports errors that way) comes as a `{"error": ...}` payload."""
    lines: list[str] = []
    async for line in resp.aiter_lines():
        if line == "":
            if lines:
                yield "\n".join(lines)
                lines = []
        elif line.startswith("data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(" ") else value)
        elif line.startswith("error:"):
            yield json.dumps({"error": line[6:].strip() or "error"})
        # comments (":"), "event:", "id:", "retry:" carry nothing we measure
    if lines:
        yield "\n".join(lines)


async def run_closed_loop(base_url: str, model: str, concurrency: int, n_requests: int,
                          prompts: Sequence[str], max_tokens: int, *, temperature: float = 0.7,
                          seed_base: int | None = 0, include_usage: bool = True,
                          timeout_s: float = 300.0, first_index: int = 0,
                          extra: dict[str, Any] | None = None,
                          on_result: Callable[[RequestResult], None] | None = None,
                          client: httpx.AsyncClient | None = None) -> list[RequestResult]:
    """Run `n_requests` streamed requests with `concurrency` of them always in flight (a new one
    starts as soon as one ends). Request i (counting from `first_index`) sends
    `prompts[i % len(prompts)]` with seed `seed_base + i`, so runs against different servers
    send the same requests. `base_url` is the server root (`http://host:port`, with or without
    `/v1`). Results come back in request order; `on_result` is called as each one ends."""
    if concurrency < 1 or n_requests < 0 or not prompts:
        raise ValueError("need concurrency >= 1, n_requests >= 0 and at least one prompt")
    url = chat_url(base_url)
    own_client = client is None
    if client is None:
        client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4))
    results: list[RequestResult | None] = [None] * n_requests
    next_slot = 0

    async def worker() -> None:
        nonlocal next_slot
        while next_slot < n_requests:
            slot = next_slot
            next_slot += 1
            i = first_index + slot
            p = i % len(prompts)
            payload = chat_payload(model, prompts[p], max_tokens, temperature=temperature,
                                   seed=None if seed_base is None else seed_base + i,
                                   include_usage=include_usage, extra=extra)
            result = await stream_chat(client, url, payload, index=i, prompt_index=p)
            results[slot] = result
            if on_result is not None:
                on_result(result)

    try:
        await asyncio.gather(*(worker() for _ in range(min(concurrency, max(n_requests, 1)))))
    finally:
        if own_client:
            await client.aclose()
    return [r for r in results if r is not None]


def chat_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    return base + "/chat/completions"


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between closest ranks
    (numpy's default method); None for no values."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError("q must be within 0..100")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _dist(values: Sequence[float], qs: Sequence[float] = (50, 90, 95, 99), scale: float = 1.0) -> dict[str, Any]:
    """Count, percentiles, mean and max of `values`, each times `scale` (None where there are none)."""
    out: dict[str, Any] = {"n": len(values)}
    for q in qs:
        v = percentile(values, q)
        out[f"p{q:g}"] = None if v is None else v * scale
    out["mean"] = sum(values) / len(values) * scale if values else None
    out["max"] = max(values) * scale if values else None
    return out


def _dist_ms(values: Sequence[float], qs: Sequence[float] = (50, 90, 95, 99)) -> dict[str, Any]:
    """The same of seconds, in milliseconds."""
    return _dist(values, qs, 1000)


def summarize(results: Sequence[RequestResult], wall_s: float) -> dict[str, Any]:
    """Aggregates of one run. Token throughput counts every completion token delivered (also those
    of cut streams) over `wall_s`; latency distributions are in milliseconds."""
    total_tokens = sum(r.completion_tokens for r in results)
    outcomes = Counter(r.outcome for r in results)
    from_usage = sum(r.tokens_from_usage for r in results)
    if not results:
        token_source = None
    elif from_usage == len(results):
        token_source = "usage"
    elif from_usage == 0:
        token_source = "content_deltas"
    else:
        token_source = "mixed"
    ok = [r for r in results if r.ok]
    itls = [r.itl_s for r in results if r.itl_s is not None]
    return {
        "n_requests": len(results),
        "n_ok": len(ok),
        "n_failed": len(results) - len(ok),
        "outcomes": dict(sorted(outcomes.items())),
        "finish_reasons": dict(sorted(Counter(str(r.finish_reason) for r in results).items())),
        "wall_s": wall_s,
        "completion_tokens": total_tokens,
        "completion_tokens_source": token_source,
        "tokens_per_s": total_tokens / wall_s if wall_s > 0 else None,
        "requests_per_s": len(results) / wall_s if wall_s > 0 else None,
        "mean_completion_tokens": total_tokens / len(results) if results else None,
        "ttft_ms": _dist_ms([r.ttft_s for r in results if r.ttft_s is not None]),
        "itl_ms": _dist_ms(itls),
        "chunk_gap_ms": _dist_ms([g for r in results for g in r.gaps_s]),
        "latency_ms": _dist_ms([r.latency_s for r in results]),
        # What each prompt had to prefill (usage's prompt tokens less its cached ones): whether two runs' TTFTs
        # compare prompts found in the cache or prompts prefilled whole.
        "uncached_prompt_tokens": _dist([r.prompt_tokens - (r.cached_tokens or 0) for r in results
                                         if r.prompt_tokens is not None]),
        "errors": sorted({r.error for r in results if r.error})[:5],
    }
