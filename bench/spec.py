"""Speculative decoding: tokens/s and time to first token without and with drafts, on a copy-heavy workload the
bundled model really follows (it repeats the lists and code it is given) and on free writing; llamaray's engine
and llama-server's `--spec-*` options side by side.

    .venv/bin/python -m bench.spec [--rounds 2] [--concurrency 1,4,16] [--max-tokens 96] [--n-max 8]
        [--arms off,lookup,lookup-always,draft,draft-always,self-draft-always,ls-off,ls-ngram-mod,ls-ngram-simple,ls-draft]

llamaray's arms run on the engine alone (no Ray, no HTTP), the bundled model with 2 threads and as many slots as
the highest concurrency:
- `off`: requests with `speculative: false`;
- `lookup`: prompt lookup, the default (adaptive: drafts verified where the sequence's measured acceptance and the
  step's measured cost say they gain); `lookup-always`: every proposal verified, up to n_max;
- `draft`, `draft-always`: a draft model, the bundled model's first 20 of 30 blocks with its head
  (tools/early_exit_gguf.py), adaptive or every proposal; `self-draft-always`: the model itself as its draft.
llama-server's arms (`ls-*`) are its HTTP `/completion` (streamed) on the same GGUF, threads and slots, with
`--spec-type none`, `ngram-mod`, `ngram-simple`, or `draft-simple` with the same early-exit draft; compare their
ratio to `ls-off` with ours to `off` (HTTP is in theirs, not in ours).

The arms take turns request wave by request wave, each first in its turn, so all see the same machine (a shared
machine's speed moves by 10% and more over minutes). No prompt reuses a cached prefix (cache_prompt false). Each
row also says how many draft tokens were verified per generated token, and how many of them were accepted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from app.config.spec import SpeculativeSpec
from app.engine import GenerationRequest, LlamaEngine, SamplingParams
from app.engine.events import Failed, Finished, Text
from app.prompt.chat_template import render_prompt
from tools.early_exit_gguf import write_early_exit

from .harness.bundled import bundled_spec
from .harness.run import comma_names, start_run
from .harness.servers import LlamaServer

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
ARMS = ("off", "lookup", "lookup-always", "draft", "draft-always", "self-draft-always",
        "ls-off", "ls-ngram-mod", "ls-ngram-simple", "ls-draft")
DEFAULT_ARMS = "off,lookup,lookup-always,draft,draft-always,ls-off,ls-ngram-mod,ls-draft"
DRAFT_LAYERS = 20


@dataclasses.dataclass
class Wave:
    tokens: int
    seconds: float
    ttft: float      # mean over the wave's requests
    drafted: int
    accepted: int
    texts: list[str]


def engine_wave(engine: LlamaEngine, prompts: list[str], speculative: bool, max_tokens: int) -> Wave:
    """The prompts submitted together to the engine."""
    before = engine.stats()["spec_decode"]
    done = [threading.Event() for _ in prompts]
    tokens, ttft, texts = [0] * len(prompts), [0.0] * len(prompts), [""] * len(prompts)
    t0 = time.perf_counter()

    def sink_for(i: int):
        def sink(ev):
            if isinstance(ev, Text):
                texts[i] += ev.text
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
    secs = time.perf_counter() - t0
    after = engine.stats()["spec_decode"]
    return Wave(sum(tokens), secs, statistics.mean(ttft), after["num_draft_tokens"] - before["num_draft_tokens"],
                after["num_accepted_tokens"] - before["num_accepted_tokens"], texts)


class SpecLlamaServer(LlamaServer):
    """llama-server with `extra` options, `slots` slots of 1024 tokens."""

    def __init__(self, log_dir: Path, name: str, slots: int, extra: list[str]) -> None:
        self.name = name
        super().__init__(log_dir)
        self.slots, self.extra = slots, extra

    def command(self) -> list[str]:
        return [self.binary, "-m", self.model_path, "-t", 2, "-tb", 2, "-np", self.slots, "-c", self.slots * 1024,
                "--cont-batching", "--no-webui", "--host", "127.0.0.1", "--port", self.port, *self.extra]


def server_wave(server: SpecLlamaServer, prompts: list[str], max_tokens: int) -> Wave:
    """The prompts sent together to llama-server's /completion, streamed."""
    results: list[tuple[int, float, int, int, str]] = [(0, 0.0, 0, 0, "")] * len(prompts)
    t0 = time.perf_counter()

    def one(i: int) -> None:
        first, n, drafted, accepted, text = 0.0, 0, 0, 0, ""
        body = {"prompt": prompts[i], "n_predict": max_tokens, "temperature": 0, "cache_prompt": False,
                "stream": True}
        with httpx.stream("POST", f"{server.base_url}/completion", json=body, timeout=600) as r:
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                chunk = json.loads(line[6:])
                text += chunk.get("content") or ""
                if chunk.get("content") and not first:
                    first = time.perf_counter() - t0
                if chunk.get("stop"):
                    timings = chunk.get("timings") or {}
                    n = chunk.get("tokens_predicted") or timings.get("predicted_n", 0)
                    drafted, accepted = timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)
        results[i] = (n, first, drafted, accepted, text)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.perf_counter() - t0
    return Wave(sum(r[0] for r in results), secs, statistics.mean(r[1] for r in results),
                sum(r[2] for r in results), sum(r[3] for r in results), [r[4] for r in results])


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.spec", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", default="1,4,16", help="comma-separated, e.g. 1,4,16")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--n-max", type=int, default=8)
    ap.add_argument("--arms", type=comma_names(ARMS), default=comma_names(ARMS)(DEFAULT_ARMS))
    ap.add_argument("--out", type=Path, default=Path("bench-results") / "spec")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    log_dir = start_run(args.out)
    slots = max(4, *levels)
    base = bundled_spec(id="bench", n_ctx=1024, n_seq_max=slots, n_threads=2)
    tmp = tempfile.TemporaryDirectory()
    draft = str(write_early_exit(Path(tmp.name) / "draft.gguf", base.path, layers=DRAFT_LAYERS))

    def engine(**spec) -> LlamaEngine:
        return LlamaEngine(dataclasses.replace(base, speculative=SpeculativeSpec(n_max=args.n_max, **spec))).start()

    makers: dict[str, Callable[[], object]] = {
        "lookup": lambda: engine(),
        "lookup-always": lambda: engine(adaptive=False),
        "draft": lambda: engine(type="draft", draft_path=draft),
        "draft-always": lambda: engine(type="draft", draft_path=draft, adaptive=False),
        "self-draft-always": lambda: engine(type="draft", draft_path=base.path, adaptive=False),
    }
    spec_types = {"ls-off": ["--spec-type", "none"], "ls-ngram-mod": ["--spec-type", "ngram-mod"],
                  "ls-ngram-simple": ["--spec-type", "ngram-simple"],
                  "ls-draft": ["--spec-type", "draft-simple", "-md", draft, "--spec-draft-n-max", str(args.n_max)]}
    runners: dict[str, Callable[[list[str]], Wave]] = {}
    held: list = []
    results: dict[tuple[int, str, str], list[Wave]] = {}
    try:
        for arm in args.arms:
            if arm in spec_types:
                server = SpecLlamaServer(log_dir, arm, slots, spec_types[arm])
                held.append(server)
                server.start()
                runners[arm] = lambda ps, s=server: server_wave(s, ps, args.max_tokens)
            elif arm != "off":
                eng = makers[arm]()
                held.append(eng)
                runners[arm] = lambda ps, e=eng: engine_wave(e, ps, True, args.max_tokens)
        if "off" in args.arms:
            eng = next((e for e in held if isinstance(e, LlamaEngine)), None) or engine()
            if eng not in held:
                held.append(eng)
            runners["off"] = lambda ps, e=eng: engine_wave(e, ps, False, args.max_tokens)
        step_ms = next((e.stats()["spec_step_ms"] for e in held if isinstance(e, LlamaEngine)), {})
        order = list(args.arms)
        for c in levels:
            for workload, texts in (("copy", COPY), ("free", FREE)):
                prompts = [render_prompt(base.chat_template, [{"role": "user", "content": t}]) for t in texts]
                for r in range(args.rounds):
                    for k in range(len(prompts)):
                        group = [prompts[(k + j) % len(prompts)] for j in range(c)]
                        shift = (r * len(prompts) + k) % len(order)  # each arm first in turn
                        for arm in order[shift:] + order[:shift]:
                            results.setdefault((c, workload, arm), []).append(runners[arm](group))
    finally:
        for thing in held:
            (thing.close if isinstance(thing, LlamaEngine) else thing.stop)()
        tmp.cleanup()
    report(args, step_ms, results)


def report(args, step_ms: dict, results: dict[tuple[int, str, str], list[Wave]]) -> None:
    print(f"n_max {args.n_max}, {args.rounds} rounds, 2 threads, {args.max_tokens} tokens; llamaray's decode step "
          f"by rows (ms): {step_ms}")
    print(f"{'conc':>4} {'workload':<9}{'arm':<19}{'tok/s':>8}{'x off':>7}{'TTFT ms':>9}{'drafted/tok':>12}"
          f"{'accepted':>9}{'same':>9}")
    table = []
    for (c, workload, arm), waves in results.items():
        tps = sum(w.tokens for w in waves) / sum(w.seconds for w in waves)
        baseline = "ls-off" if arm.startswith("ls-") else "off"
        ref = results.get((c, workload, baseline))
        ratio = tps / (sum(w.tokens for w in ref) / sum(w.seconds for w in ref)) if ref else float("nan")
        drafted, taken = sum(w.drafted for w in waves), sum(w.accepted for w in waves)
        # Greedy replies equal to the baseline's for the same prompts in the same turn (verifying several tokens
        # in one batch may part a reply where the model's top two tokens nearly tie).
        pairs = [(a, b) for w, v in zip(waves, ref or []) for a, b in zip(w.texts, v.texts)]
        same = f"{sum(a == b for a, b in pairs)}/{len(pairs)}"
        entry = {"concurrency": c, "workload": workload, "arm": arm, "tok_s": round(tps, 1),
                 "x_off": round(ratio, 3), "ttft_ms": round(1000 * statistics.mean(w.ttft for w in waves), 1),
                 "drafted_per_token": round(drafted / max(1, sum(w.tokens for w in waves)), 3),
                 "acceptance": round(taken / drafted, 3) if drafted else None, "same_replies": same}
        table.append(entry)
        print(f"{c:>4} {workload:<9}{arm:<19}{tps:>8.1f}{ratio:>7.2f}{entry['ttft_ms']:>9.1f}"
              f"{entry['drafted_per_token']:>12.3f}{entry['acceptance'] if drafted else '-':>9}{same:>9}")
    print(json.dumps({"step_ms": step_ms, "rows": table}))


if __name__ == "__main__":
    main()
