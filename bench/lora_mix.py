"""python -m bench.lora_mix: what mixed-adapter traffic costs against adapter-homogeneous traffic, on the engine.

    .venv/bin/python -m bench.lora_mix [--concurrency 8] [--rounds 3] [--max-tokens 64] [--threads 2] [--out F.json]

Adapters: random LoRA GGUFs for the bundled model (tools/make_lora.py, attn_q and ffn_down of 4 layers,
rank 8). Each wave submits `c` greedy requests at once (a prompt text of its own each, so nothing is shared),
all decoding together. Workloads: `base` (no adapter), `one` (all under adapter a1), `mixed-2` (half a1,
half a2), `mixed-4` (a quarter each: base, a1, a2, a1+a2 at 0.5). The engine decodes one adapter set per
step (docs/architecture.md), so k sets take about k times the steps; the table shows what that costs.
Workloads take turns within each round, their order rotating; each cell is the median over rounds. Per
cell: completion tok/s of the wave, TTFT median, the wave's adapter switches and decode steps (those two do not
depend on the machine's speed: the cost in steps is exact, the cost in time needs a quiet machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from app.engine import GenerationRequest, LlamaEngine, SamplingParams
from app.engine.events import Finished, Text
from app.prompt.chat_template import render_prompt
from tools.make_lora import write_lora

from .harness.bundled import bundled_spec

SETS = {"base": (), "a1": (("a1", 1.0),), "a2": (("a2", 1.0),), "both": (("a1", 0.5), ("a2", 0.5))}
WORKLOADS = {"base": ["base"], "one": ["a1"], "mixed-2": ["a1", "a2"], "mixed-4": ["base", "a1", "a2", "both"]}


class _Box:
    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first: float | None = None
        self.tokens = 0
        self.done = False

    def __call__(self, event) -> None:
        if isinstance(event, Text):
            self.first = self.first or time.perf_counter()
            self.tokens += event.tokens
        elif isinstance(event, Finished):
            self.tokens = event.completion_tokens
            self.done = True
        else:
            self.done = self.done or type(event).__name__ == "Failed"


def wave(eng: LlamaEngine, spec, workload: str, c: int, max_tokens: int, tag: str) -> dict:
    sets = WORKLOADS[workload]
    boxes, gens = [], []
    for i in range(c):
        prompt = render_prompt(spec.chat_template, [{"role": "user", "content": f"Tell me about city number {tag}-{i}."}])
        box = _Box()
        req = GenerationRequest(request_id=f"{tag}-{i}", prompt=prompt, max_tokens=max_tokens, cache_prompt=False,
                                sampling=SamplingParams(temperature=0), adapters=SETS[sets[i % len(sets)]])
        gens.append(eng.prepare(req, box))
        boxes.append(box)
    switches, steps = eng.stats()["adapter_switches"], eng.steps
    start = time.perf_counter()
    with eng._cv:  # one wave: all queued at once
        for gen, box in zip(gens, boxes):
            box.start = start
            eng.submit(gen)
    while not all(b.done for b in boxes):
        time.sleep(0.005)
    elapsed = time.perf_counter() - start
    return {"tok_s": sum(b.tokens for b in boxes) / elapsed,
            "ttft_ms": statistics.median((b.first or start) - start for b in boxes) * 1000,
            "switches": eng.stats()["adapter_switches"] - switches, "steps": eng.steps - steps}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.lora_mix", description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    spec = bundled_spec(n_ctx=512, n_seq_max=args.concurrency, n_threads=args.threads, startup_self_check=False)
    eng = LlamaEngine(spec).start()
    results: dict[str, list[dict]] = {w: [] for w in WORKLOADS}
    with tempfile.TemporaryDirectory() as tmp:
        eng.load_adapter("a1", str(write_lora(Path(tmp) / "a1.gguf", seed=1)))
        eng.load_adapter("a2", str(write_lora(Path(tmp) / "a2.gguf", seed=2)))
        try:
            wave(eng, spec, "base", args.concurrency, 8, "warm")
            names = list(WORKLOADS)
            for r in range(args.rounds):
                for w in names[r % len(names):] + names[:r % len(names)]:
                    results[w].append(wave(eng, spec, w, args.concurrency, args.max_tokens, f"{r}{w}"))
        finally:
            eng.close()
    table = {w: {k: statistics.median(x[k] for x in rs) for k in ("tok_s", "ttft_ms", "switches", "steps")}
             for w, rs in results.items()}
    print(f"{'workload':10} {'sets':>4} {'tok/s':>7} {'TTFT ms':>8} {'switches':>8} {'steps':>6}")
    for w, row in table.items():
        print(f"{w:10} {len(WORKLOADS[w]):>4} {row['tok_s']:7.1f} {row['ttft_ms']:8.0f} {row['switches']:8.0f} "
              f"{row['steps']:6.0f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "table": table, "raw": results}, indent=2))


if __name__ == "__main__":
    main()
