"""python -m bench.prompt_cache [--entries 10,50,200,1000] [--prompt-tokens 150]: what the prompt cache's lookups
cost the decode thread at each admission (app/engine/prompt_cache.py), by how many prompts it holds.

Entries of 80-300 random tokens after a shared 30-token header (a chat template's), one scope; a new prompt
of `--prompt-tokens` after the same header. Per admission the engine asks `best` (a cached prefix to restore)
and, before overwriting a slot, `worth_keeping` and `put`; the table gives each one's mean over 50 calls, in
ms (put into a copy of the cache, so every call finds the same entries). No model: the KV states are stand-ins.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import numpy as np

from app.engine.prompt_cache import PromptCache


def filled(entries: int, header: list[int], rng: np.random.Generator) -> PromptCache:
    cache = PromptCache(max_bytes=1 << 50)
    for _ in range(entries):
        cache.put(header + [int(t) for t in rng.integers(0, 49_000, int(rng.integers(80, 300)))], b"", 1, "")
    return cache


def mean_ms(fn, calls: int = 50) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.prompt_cache")
    p.add_argument("--entries", default="10,50,200,1000")
    p.add_argument("--prompt-tokens", type=int, default=150)
    ns = p.parse_args(argv)
    rng = np.random.default_rng(0)
    header = [int(t) for t in rng.integers(0, 49_000, 30)]
    prompt = header + [int(t) for t in rng.integers(0, 49_000, ns.prompt_tokens)]
    print("| entries | best ms | worth_keeping ms | put ms |\n|---|---|---|---|")
    for n in (int(x) for x in ns.entries.split(",")):
        cache = filled(n, header, rng)
        copies, used = [copy.deepcopy(cache) for _ in range(50)], iter(range(50))
        put = mean_ms(lambda: copies[next(used)].put(prompt, b"", 1, ""))  # the copies freed after: not timed
        print(f"| {n} | {mean_ms(lambda: cache.best(prompt, '')):.3f} | "
              f"{mean_ms(lambda: cache.worth_keeping(prompt, '')):.3f} | {put:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
