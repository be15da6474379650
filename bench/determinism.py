"""How often a seeded request's text differs when it runs inside a batch instead of alone.

llama.cpp's arithmetic depends on the batch's shape, so the same seeded request can sample a
different token once other sequences share its decode steps. This measures how often that
happens with the bundled model (engine only, no Ray):

    .venv/bin/python -m bench.determinism [--requests 24] [--batch 4] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import threading

from app.engine import GenerationRequest, LlamaEngine, SamplingParams
from app.engine.events import Failed, Finished, Text
from app.prompt.chat_template import render_prompt

from .harness.bundled import bundled_spec
from .load.loadgen import DEFAULT_PROMPTS


def _run(engine: LlamaEngine, jobs: list[tuple[str, str, int]], max_tokens: int) -> dict[str, str]:
    """Submit all jobs at once; return request id -> text."""
    done = {rid: threading.Event() for rid, _, _ in jobs}
    texts: dict[str, list[str]] = {rid: [] for rid, _, _ in jobs}

    def sink_for(rid: str):
        def sink(ev):
            if isinstance(ev, Text):
                texts[rid].append(ev.text)
            elif isinstance(ev, (Finished, Failed)):
                done[rid].set()
        return sink

    for rid, prompt, seed in jobs:
        req = GenerationRequest(request_id=rid, prompt=prompt, max_tokens=max_tokens,
                                sampling=SamplingParams(temperature=0.7, seed=seed))
        engine.submit(engine.prepare(req, sink_for(rid)))
    for event in done.values():
        event.wait()
    return {rid: "".join(parts) for rid, parts in texts.items()}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.determinism", description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ns = ap.parse_args()
    spec = bundled_spec(n_ctx=2048, n_seq_max=max(ns.batch, 1), n_threads=2)
    engine = LlamaEngine(spec).start()
    try:
        prompts = [render_prompt(spec.chat_template, [{"role": "user", "content": DEFAULT_PROMPTS[i % len(DEFAULT_PROMPTS)]}])
                   for i in range(ns.requests)]
        alone = {}
        for i, p in enumerate(prompts):
            alone.update(_run(engine, [(f"a{i}", p, 1000 + i)], ns.max_tokens))
        batched = {}
        for start in range(0, ns.requests, ns.batch):
            jobs = [(f"b{i}", prompts[i], 1000 + i) for i in range(start, min(start + ns.batch, ns.requests))]
            batched.update(_run(engine, jobs, ns.max_tokens))
        again = {}
        for i, p in enumerate(prompts):
            again.update(_run(engine, [(f"c{i}", p, 1000 + i)], ns.max_tokens))
        differ = sum(alone[f"a{i}"] != batched[f"b{i}"] for i in range(ns.requests))
        unstable = sum(alone[f"a{i}"] != again[f"c{i}"] for i in range(ns.requests))
        print(json.dumps({"requests": ns.requests, "batch": ns.batch, "max_tokens": ns.max_tokens,
                          "alone_vs_batched_differ": differ, "alone_vs_alone_again_differ": unstable}))
    finally:
        engine.close()


if __name__ == "__main__":
    main()
