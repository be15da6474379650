"""The engine alone (no Ray, no HTTP): tokens/s for N sequences decoded together, to separate
llama.cpp's speed from the serving graph's overhead.

    .venv/bin/python -m bench.engine [--concurrency 1,16] [--max-tokens 128] [--cpu-extra-buffers on|off]
        [--logprobs K] [--gpu-layers N] [--prompt-tokens N] [--closed-loop REQUESTS]

--prompt-tokens N adds the prompt rate: one request with a prompt of about N tokens and one completion
token, each time a new text so the prompt cache cannot serve it; prompt tokens per second.
"""

from __future__ import annotations

import argparse
import json
import queue
import threading
import time

from app.engine import GenerationRequest, LlamaEngine, SamplingParams, hardware
from app.engine.events import Failed, Finished
from app.engine.llama import model_buffers
from app.prompt.chat_template import render_prompt

from .harness.bundled import bundled_spec
from .load.loadgen import DEFAULT_PROMPTS


def bench_request(template: str, i: int, max_tokens: int, request_id: str,
                  logprobs: int | None = None) -> GenerationRequest:
    """Request i as `python -m bench` sends it: prompt i of the bench's list, temperature 0.7, seed i."""
    prompt = render_prompt(template, [{"role": "user", "content": DEFAULT_PROMPTS[i % len(DEFAULT_PROMPTS)]}])
    return GenerationRequest(request_id=request_id, prompt=prompt, max_tokens=max_tokens,
                             sampling=SamplingParams(temperature=0.7, seed=i), logprobs=logprobs)


def wave(engine: LlamaEngine, template: str, n: int, max_tokens: int, first: int, logprobs: int | None = None) -> float:
    """n requests submitted together; completion tokens per second until the last finishes."""
    done, tokens = [], []

    def sink_for(event: threading.Event):
        def sink(ev):
            if isinstance(ev, Finished):
                tokens.append(ev.completion_tokens)
            if isinstance(ev, (Finished, Failed)):
                event.set()
        return sink

    t0 = time.perf_counter()
    for i in range(first, first + n):
        event = threading.Event()
        done.append(event)
        engine.submit(engine.prepare(bench_request(template, i, max_tokens, f"r{i}", logprobs), sink_for(event)))
    for event in done:
        event.wait()
    return sum(tokens) / (time.perf_counter() - t0)


def closed_loop(engine: LlamaEngine, template: str, n: int, requests: int, max_tokens: int, first: int) -> float:
    """`requests` requests, n at a time, the next submitted as one finishes (as `python -m bench` sends them to a
    server, prompt after prompt); completion tokens per second from the first submit to the last finish.
    Unlike `wave`, prefills of new requests run beside the others' decodes, as in a server."""
    ended: queue.SimpleQueue = queue.SimpleQueue()

    def sink(ev) -> None:  # on the engine's thread: hand the end over, submit from this one
        if isinstance(ev, (Finished, Failed)):
            ended.put(ev.completion_tokens if isinstance(ev, Finished) else 0)

    def submit(i: int) -> None:
        engine.submit(engine.prepare(bench_request(template, i, max_tokens, f"l{i}"), sink))

    t0 = time.perf_counter()
    submitted = min(n, requests)
    for i in range(submitted):
        submit(first + i)
    tokens = 0
    for _ in range(requests):
        tokens += ended.get()
        if submitted < requests:
            submit(first + submitted)
            submitted += 1
    return tokens / (time.perf_counter() - t0)


def prefill(engine: LlamaEngine, template: str, n_tokens: int, salt: int) -> float:
    """Prompt tokens per second of one request of about n_tokens prompt tokens (first to last token)."""
    words = " ".join(f"{salt}-{i}" for i in range(n_tokens // 4))  # ~4 tokens a word; `salt` keeps it uncached
    prompt = render_prompt(template, [{"role": "user", "content": f"Summarize: {words}"}])
    finished: list[Finished | Failed] = []
    done = threading.Event()

    def sink(ev):
        if isinstance(ev, (Finished, Failed)):
            finished.append(ev)
            done.set()

    t0 = time.perf_counter()
    engine.submit(engine.prepare(GenerationRequest(request_id=f"p{salt}", prompt=prompt, max_tokens=1,
                                                   sampling=SamplingParams(temperature=0.0)), sink))
    done.wait()
    elapsed = time.perf_counter() - t0
    if not isinstance(finished[0], Finished):
        raise RuntimeError(f"the prefill request failed: {finished[0]}")
    return (finished[0].prompt_tokens - finished[0].cached_tokens) / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.engine", description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--logprobs", type=int, default=None, help="ask every request for logprobs with this many alternatives")
    ap.add_argument("--gpu-layers", type=int, default=0, help="layers on the GPU (-1: all; bench/gpu_check.py)")
    ap.add_argument("--cpu-extra-buffers", default="auto", choices=["auto", "on", "off"],
                    help="llama.cpp's repacked/AMX weight buffers (the model config key of the same name)")
    ap.add_argument("--closed-loop", type=int, default=0, metavar="REQUESTS",
                    help="also run this many requests per level the way `python -m bench` sends them: a new one as "
                         "one finishes (key closed_loop_tokens_per_s)")
    ap.add_argument("--prompt-tokens", type=int, default=0,
                    help="also measure the prompt rate on a prompt of about this many tokens (best of 3)")
    ns = ap.parse_args()
    levels = [int(c) for c in ns.concurrency.split(",")]
    spec = bundled_spec(n_ctx=2048, n_seq_max=max(levels), n_threads=ns.threads,
                        n_gpu_layers=ns.gpu_layers, cpu_extra_buffers=ns.cpu_extra_buffers)
    engine = LlamaEngine(spec).start()
    try:
        wave(engine, spec.chat_template, 1, 16, 10_000)  # warm-up
        out = {}
        for n in levels:
            wave(engine, spec.chat_template, n, ns.max_tokens, 0, ns.logprobs)  # caches warm, as in a server
            out[f"c={n}"] = round(wave(engine, spec.chat_template, n, ns.max_tokens, 100, ns.logprobs), 1)
        extra = {}
        if ns.closed_loop:
            extra["closed_loop_tokens_per_s"] = {
                f"c={n}": round(closed_loop(engine, spec.chat_template, n, ns.closed_loop, ns.max_tokens, 200), 1)
                for n in levels}
        if ns.prompt_tokens:
            extra["prompt_tokens_per_s"] = round(max(prefill(engine, spec.chat_template, ns.prompt_tokens, salt)
                                                     for salt in range(3)), 1)
        print(json.dumps({"tokens_per_s": out, **extra, "cpu_backend": hardware.cpu_backend(), "threads": ns.threads, "max_tokens": ns.max_tokens,
                          "cpu_extra_buffers": ns.cpu_extra_buffers, "logprobs": ns.logprobs, "weights": dict(model_buffers)}))
    finally:
        engine.close()


if __name__ == "__main__":
    main()
