"""python -m bench.hostile --url URL --model ID: do hostile requests stall the streams of everyone else?

Eight streaming chat requests run back to back (each of 8 workers starts the next when one ends) while
four hostile requests arrive together:

- `big_message`: a chat message just under the server's 4 MiB body limit (`--message-bytes`): the
  template renders it and the model must refuse it without tokenizing megabytes on a busy loop;
- `large_grammar`: a `grammar` of ~60 KB with 60 alternatives open at every step (just under
  limits.max_grammar_bytes), which llguidance compiles and masks;
- `logprobs_bomb`: /v1/completions with 128 prompts of ~1,000 tokens, `echo`, `logprobs: 20` and
  `max_tokens: 0` (gigabytes of logprob entries unless refused);
- `n_max`: a chat request for `--n` choices at once (the model's n_seq_max), which needs every slot;
- `image_bomb_<k>` (`--image-bombs K`, for a model with a projector): K chat requests of
  `--images-per-bomb` progressive JPEGs each, 2048x2048 with the last scan repeated 1,500 times (~60 kB
  that decode for seconds each: `scan_bomb` below). `--only image_bomb` sends only those;
- `dag_grammar_<k>` (`--dag-grammars K`): K chat requests whose ~320-byte GBNF has rules that each refer to
  the next four times (4^14 terminal parts written out): work that, expanded, would hold a planning thread for
  minutes after the request's refusal. `--only dag_grammar` sends only those.

The hostile requests go with `--hostile-api-key` when given (another key than the streams': on a server with
keys, what one key sends must not cost the others). Prints the streams' inter-chunk gaps (p50, p99, max; during
the hostile requests, at least `--min-window` seconds from their arrival, and over the whole run), the time to
first token of the streams that started in that window against those that did not, and each hostile request's
HTTP status, error code and time (the repeated ones summed up), and writes them as JSON with `--out`.
Target: inter-chunk p99 under 250 ms (FAIL printed next to a miss). Exits 1 when a stream failed.
Nothing is started here: point it at a running server.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from PIL import Image

from .load.loadgen import DEFAULT_PROMPTS, RequestResult, chat_payload, chat_url, percentile, stream_chat

TARGET_P99_S = 0.25
STREAMS = 8


@dataclass
class Hostile:
    name: str
    path: str  # under /v1
    body: dict[str, Any]
    sent: float = 0.0
    done: float = 0.0
    status: int | None = None
    code: str | None = None
    error: str | None = None

    def report(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "code": self.code, "error": self.error,
                "seconds": round(self.done - self.sent, 3)}


@dataclass
class Streams:
    results: list[RequestResult] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)


def v1(base_url: str, path: str) -> str:
    return chat_url(base_url).removesuffix("/chat/completions") + path


def big_grammar(max_bytes: int = 60_000, alternatives: int = 60) -> str:
    """As large and as branchy as the server accepts (64 KiB, 64 parse stacks): a sequence of rules,
    each a choice among `alternatives` distinct words, so every step checks that many stacks."""
    rules, size, i = [], 0, 0
    while True:
        words = " | ".join(f'"w{i:03d}{j:02d}x"' for j in range(alternatives))
        rule = f"r{i} ::= {words}"
        if size + len(rule) + 16 > max_bytes - 16:
            break
        rules.append(rule)
        size += len(rule) + 1 + len(f" r{i}")
        i += 1
    return "root ::= " + " ".join(f"r{k}" for k in range(len(rules))) + "\n" + "\n".join(rules)


def dag_grammar(depth: int = 14, fan: int = 4) -> str:
    """Rules that each refer to the next `fan` times: small to send, fan^depth terminal parts written out."""
    rules = ["root ::= r0"] + [f"r{i} ::= " + " ".join([f"r{i + 1}"] * fan) for i in range(depth)]
    return "\n".join(rules + [f'r{depth} ::= "ab"'])


def dag_grammars(model: str, count: int) -> list[Hostile]:
    return [Hostile(f"dag_grammar_{k}", "/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": "Pick a word."}], "max_tokens": 8,
        "grammar": dag_grammar()}) for k in range(count)]


def scan_bomb(times: int = 1500, side: int = 2048) -> bytes:
    """A progressive JPEG of the largest picture side the server scales to (2048) with its last scan repeated:
    about 60 kB that libjpeg decodes scan by scan, each scan walking every block (seconds of one core per image
    on a 2-core machine, unless refused by its scan count before decoding: limits.max_jpeg_scans). Made with
    Pillow here, so the bench needs no test helpers."""
    buf = io.BytesIO()
    Image.new("RGB", (side, side), (200, 30, 30)).save(buf, "JPEG", progressive=True, quality=90)
    jpeg = buf.getvalue()
    last, end = jpeg.rindex(b"\xff\xda"), jpeg.rindex(b"\xff\xd9")
    return jpeg[:end] + jpeg[last:end] * times + jpeg[end:]


def image_bombs(model: str, count: int, per_request: int) -> list[Hostile]:
    bomb = {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,"
                                                      + base64.b64encode(scan_bomb()).decode("ascii")}}
    return [Hostile(f"image_bomb_{k}", "/chat/completions", {
        "model": model, "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, *[bomb] * per_request]}]}) for k in range(count)]


def hostile_requests(model: str, n: int, message_bytes: int, image_count: int = 0,
                     images_per_request: int = 1, only: str | None = None, grammar_count: int = 0) -> list[Hostile]:
    hostile = (text_bombs(model, n, message_bytes) + image_bombs(model, image_count, images_per_request)
               + dag_grammars(model, grammar_count))
    return [h for h in hostile if only is None or h.name.startswith(only)]


def text_bombs(model: str, n: int, message_bytes: int) -> list[Hostile]:
    user = [{"role": "user", "content": "x" * message_bytes}]
    long_prompt = " ".join(["The committee reviewed the annual report in detail."] * 120)  # ~1,000 tokens
    return [
        Hostile("big_message", "/chat/completions", {"model": model, "messages": user, "max_tokens": 16}),
        Hostile("large_grammar", "/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": "Pick a word."}], "max_tokens": 8,
            "grammar": big_grammar()}),
        Hostile("logprobs_bomb", "/completions", {
            "model": model, "prompt": [f"{k}: {long_prompt}" for k in range(128)], "echo": True, "logprobs": 20,
            "max_tokens": 0}),
        Hostile("n_max", "/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 64,
            "n": n}),
    ]


async def send(client: httpx.AsyncClient, base_url: str, h: Hostile, headers: dict[str, str]) -> None:
    h.sent = time.perf_counter()
    try:
        resp = await client.post(v1(base_url, h.path), json=h.body, headers=headers)
        h.status = resp.status_code
        if resp.status_code != 200:
            try:
                err = resp.json().get("error") or {}
                h.code, h.error = err.get("code"), (err.get("message") or "")[:200]
            except (ValueError, AttributeError):
                h.error = resp.text[:200]
    except (httpx.HTTPError, OSError) as exc:
        h.error = f"{type(exc).__name__}: {exc}"
    finally:
        h.done = time.perf_counter()


async def stream_worker(client: httpx.AsyncClient, url: str, model: str, k: int, max_tokens: int,
                        streams: Streams) -> None:
    """Streams back to back until told to stop (the one running then goes to its end)."""
    i = 0
    while not streams.stop.is_set():
        prompt = DEFAULT_PROMPTS[(k + i * STREAMS) % len(DEFAULT_PROMPTS)]
        payload = chat_payload(model, prompt, max_tokens, seed=k * 1000 + i)
        streams.results.append(await stream_chat(client, url, payload, index=k * 1000 + i, prompt_index=k))
        i += 1


def gaps_between(results: list[RequestResult], t0: float | None = None, t1: float | None = None) -> list[float]:
    """Inter-chunk gaps of every stream; with t0/t1 (perf_counter), only gaps that ended within them."""
    out = []
    for r in results:
        times = [r.start + t for t in r.content_times]
        for a, b in zip(times, times[1:]):
            if (t0 is None or b >= t0) and (t1 is None or b <= t1):
                out.append(b - a)
    return out


def ttfts(results: list[RequestResult], t0: float, t1: float) -> tuple[list[float], list[float]]:
    """Times to first token of the streams that started within [t0, t1] (perf_counter), and of the others."""
    inside, outside = [], []
    for r in results:
        if r.ttft_s is not None:
            (inside if t0 <= r.start <= t1 else outside).append(r.ttft_s)
    return inside, outside


def dist_ms(gaps: list[float]) -> dict[str, Any]:
    def ms(v: float | None) -> float | None:
        return None if v is None else round(v * 1000, 1)
    return {"n": len(gaps), "p50_ms": ms(percentile(gaps, 50)), "p99_ms": ms(percentile(gaps, 99)),
            "max_ms": ms(max(gaps) if gaps else None)}


async def run(ns: argparse.Namespace) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {ns.api_key}"} if ns.api_key else {}
    hostile_key = ns.hostile_api_key or ns.api_key
    hostile_headers = {"Authorization": f"Bearer {hostile_key}"} if hostile_key else {}
    timeout = httpx.Timeout(ns.timeout, connect=10.0)
    limits = httpx.Limits(max_connections=STREAMS + 8, max_keepalive_connections=STREAMS + 8)
    streams = Streams()
    async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=headers) as client:
        url = chat_url(ns.url)
        workers = [asyncio.create_task(stream_worker(client, url, ns.model, k, ns.max_tokens, streams))
                   for k in range(STREAMS)]
        await asyncio.sleep(ns.warmup)  # the streams are under way
        hostile = hostile_requests(ns.model, ns.n, ns.message_bytes, ns.image_bombs, ns.images_per_bomb, ns.only,
                                   ns.dag_grammars)
        t0 = time.perf_counter()
        await asyncio.gather(*(send(client, ns.url, h, hostile_headers) for h in hostile))
        # Refused requests end in milliseconds: the window is at least --min-window, so it holds gaps.
        t1 = max(time.perf_counter(), t0 + ns.min_window)
        await asyncio.sleep(t1 - time.perf_counter() + ns.after)
        streams.stop.set()
        await asyncio.gather(*workers)
    failed = [r for r in streams.results if not r.ok]
    during = dist_ms(gaps_between(streams.results, t0, t1))
    ttft_inside, ttft_outside = ttfts(streams.results, t0, t1)
    return {"url": ns.url, "model": ns.model, "streams": STREAMS, "stream_requests": len(streams.results),
            "stream_failures": [{"outcome": r.outcome, "error": r.error} for r in failed],
            "gaps_during_hostile": during, "gaps_all": dist_ms(gaps_between(streams.results)),
            "ttft_during_hostile": dist_ms(ttft_inside), "ttft_otherwise": dist_ms(ttft_outside),
            "hostile_window_s": round(t1 - t0, 3), "hostile": [h.report() for h in hostile],
            "target_p99_ms": TARGET_P99_S * 1000,
            "met": during["p99_ms"] is not None and during["p99_ms"] < TARGET_P99_S * 1000 and not failed}


def print_report(rep: dict[str, Any]) -> None:
    during, whole = rep["gaps_during_hostile"], rep["gaps_all"]
    verdict = "" if rep["met"] else "   FAIL"
    print(f"{rep['streams']} streams, {rep['stream_requests']} requests, {len(rep['stream_failures'])} failed")
    print(f"inter-chunk gaps while the hostile requests ran ({rep['hostile_window_s']} s): "
          f"p50 {during['p50_ms']} ms, p99 {during['p99_ms']} ms, max {during['max_ms']} ms (n={during['n']}); "
          f"target p99 < {rep['target_p99_ms']:.0f} ms{verdict}")
    print(f"inter-chunk gaps over the whole run: p50 {whole['p50_ms']} ms, p99 {whole['p99_ms']} ms, "
          f"max {whole['max_ms']} ms (n={whole['n']})")
    inside, outside = rep["ttft_during_hostile"], rep["ttft_otherwise"]
    print(f"time to first token of streams started while the hostile requests ran: p50 {inside['p50_ms']} ms, "
          f"p99 {inside['p99_ms']} ms (n={inside['n']}); of the others: p50 {outside['p50_ms']} ms, "
          f"p99 {outside['p99_ms']} ms (n={outside['n']})")
    for (name, _, _), group in grouped(rep["hostile"]).items():
        h, n = group[0], len(group)
        slowest = max(g["seconds"] for g in group)
        label = f"{name} x{n}" if n > 1 else name
        print(f"  {label:<18} HTTP {h['status']}  {h['code'] or '':<26} {slowest:>7.2f} s{' (slowest)' if n > 1 else ''}"
              f"  {h['error'] or ''}")
    for f in rep["stream_failures"][:5]:
        print(f"  stream failed: {f['outcome']}: {f['error']}")


def grouped(reports: list[dict[str, Any]]) -> dict[tuple[str, Any, Any], list[dict[str, Any]]]:
    """Hostile requests by kind (`dag_grammar_7` is a `dag_grammar`) and answer (status, code)."""
    out: dict[tuple[str, Any, Any], list[dict[str, Any]]] = {}
    for h in reports:
        out.setdefault((re.sub(r"_\d+$", "", h["name"]), h["status"], h["code"]), []).append(h)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", required=True)
    p.add_argument("--api-key", default=None)
    p.add_argument("--n", type=int, default=16, help="choices of the n_max request (the model's n_seq_max)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per streamed request")
    p.add_argument("--message-bytes", type=int, default=4 * 1024 * 1024 - 4096,
                   help="size of the big message (default: just under the 4 MiB body limit)")
    p.add_argument("--image-bombs", type=int, default=0,
                   help="chat requests carrying slow-to-decode JPEGs (the model needs a projector)")
    p.add_argument("--images-per-bomb", type=int, default=2, help="JPEGs in each image bomb request")
    p.add_argument("--dag-grammars", type=int, default=0,
                   help="chat requests whose grammar's rules each refer to the next several times")
    p.add_argument("--hostile-api-key", default=None, help="the key the hostile requests use (default: --api-key)")
    p.add_argument("--only", default=None, help="send only the hostile requests whose name starts with this")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of streaming before the hostile requests")
    p.add_argument("--min-window", type=float, default=0.0,
                   help="measure the gaps over at least this many seconds from the hostile requests' arrival")
    p.add_argument("--after", type=float, default=2.0, help="seconds of streaming after them")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--out", default=None, help="write the report here as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    rep = asyncio.run(run(ns))
    print_report(rep)
    if ns.out:
        with open(ns.out, "w") as f:
            json.dump(rep, f, indent=2)
    return 1 if rep["stream_failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
