"""python -m bench.kvcache: the KV a replica prefilled, restored by a replica that never saw it, against prefilling
it again; and a q8_0 KV cache against f16.

    .venv/bin/python -m bench.kvcache [--rounds 3] [--preamble-tokens 3500] [--conversations 20] [--parts cold,types]

On the engine alone (no Ray, no HTTP: what the graph adds is the same in both arms), the bundled model, 2 threads:

- `cold`: an agent's workload, one preamble of about `--preamble-tokens` tokens (a system prompt, tool schemas,
  earlier turns) shared by `--conversations` conversations of short turns. Each round starts a new engine (a cold
  replica: nothing in its slots or memory) twice, taking turns: `prefill`, whose node's disk is empty, and
  `restore`, whose node's disk holds the preamble a previous engine saved (app/kvstore); a third arm,
  `restore-cluster`, has an empty disk and the preamble in a cluster store (a folder through fsspec). Each
  engine answers the conversations' first turns one after another. Rows: the first request's time to first
  token (the cold replica's: what the issue's target is about), the other conversations' (they find the preamble
  in memory in every arm), and how many prompt tokens the first one reused.
- `types`: the same engine with `cache_type_k/v` f16 then q8_0, taking turns: bytes a slot's KV takes per token,
  decode tokens/s at one stream and at 4, prefill tokens/s, and how many greedy replies (of 16) equal f16's
  exactly, part at a near-tie (the top two tokens within 0.25 nats where they part), or part elsewhere.

Prints the tables, writes <out>/kvcache.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from app.engine import GenerationRequest, LlamaEngine, SamplingParams
from app.engine.events import Finished, Started, Text, TokenLogprob
from app.prompt.chat_template import render_prompt

from .harness.bundled import bundled_spec
from .harness.run import comma_names, log, start_run
from .reports.tables import fmt, text_table, write_run

TIE_NATS = 0.25  # tests/support/ties.py: the gap below which two greedy replies may part
PARTS = ("cold", "types")
TOOLS = ("Tool `{name}`: {what}. Arguments: {{\"order_id\": string, \"reason\": string, \"priority\": integer}}. "
         "Call it only when the customer asks about {what}; never invent an order id; answer in one sentence. ")
TOPICS = ["refunds", "parcel tracking", "address changes", "invoices", "damaged goods", "returns", "warranties",
          "delivery slots", "customs fees", "gift wrapping", "loyalty points", "store hours"]
QUESTIONS = ["Where is my parcel?", "Can I get a refund?", "How do I change my address?", "Is my invoice ready?",
             "My mug arrived broken.", "How do I return shoes?", "Does the warranty cover this?",
             "Can I pick a delivery slot?", "Who pays customs?", "Can you wrap it?", "How many points do I have?",
             "When do you open?", "Cancel my order.", "Is it in stock?", "Ship to Spain?", "Pay by card?",
             "Track order 42.", "Change my email.", "Where is the receipt?", "Talk to a human."]


def preamble(target_tokens: int, engine: LlamaEngine) -> str:
    """A system prompt of about `target_tokens` tokens: rules and tool notes, as an agent framework writes them."""
    parts, i = ["You are the support agent of a shipping company. "], 0
    while len(engine.tokenize("".join(parts))) < target_tokens:
        topic = TOPICS[i % len(TOPICS)]
        parts.append(TOOLS.format(name=f"tool_{i}", what=topic))
        i += 1
    return "".join(parts)


def chat(spec: Any, system: str, question: str) -> str:
    return render_prompt(spec.chat_template, [{"role": "system", "content": system},
                                              {"role": "user", "content": question}],
                         bos_token=spec.bos_token, eos_token=spec.eos_token)


def ask(engine: LlamaEngine, prompt: str, max_tokens: int = 16, logprobs: int | None = None) -> dict[str, Any]:
    """One greedy request, waited for: its time to first token, tokens, reuse and reply."""
    events: list[Any] = []
    done = threading.Event()

    def sink(event: Any) -> None:
        events.append(event)
        if isinstance(event, Finished) or getattr(event, "error", None) is not None:
            done.set()
    req = GenerationRequest(request_id=f"kv{time.monotonic_ns()}", prompt=prompt, max_tokens=max_tokens,
                            sampling=SamplingParams(temperature=0), logprobs=logprobs)
    t0 = time.perf_counter()
    engine.submit(engine.prepare(req, sink))
    first = None
    while not done.wait(0.001):
        if first is None and any(isinstance(e, Text) for e in events):
            first = time.perf_counter() - t0
    end = time.perf_counter() - t0
    if first is None:
        first = end
    started = next(e for e in events if isinstance(e, Started))
    finished = next(e for e in events if isinstance(e, Finished))
    lps = [lp for e in events if isinstance(e, Text) for lp in e.logprobs]
    return {"ttft_s": first, "total_s": end, "prompt_tokens": started.prompt_tokens,
            "cached_tokens": started.cached_tokens, "from": started.cached_from,
            "tokens": finished.completion_tokens, "text": "".join(e.text for e in events if isinstance(e, Text)),
            "logprobs": lps}


def engine_for(spec: Any, disk: Path | None, store: str = "", **fields: Any) -> LlamaEngine:
    spec = dataclasses.replace(spec, kv_disk_dir=str(disk) if disk is not None else "", kv_store=store, **fields)
    engine = LlamaEngine(spec).start()
    if engine.placement.tiers is not None:
        engine.placement.tiers.wait_ready(120)
    return engine


def cold(ns: argparse.Namespace, spec: Any, work: Path) -> list[dict[str, Any]]:
    """The cold-replica arms, taking turns round by round."""
    probe = engine_for(spec, None)
    system = preamble(ns.preamble_tokens, probe)
    probe.close()
    prompts = [chat(spec, system, q) for q in QUESTIONS[:ns.conversations]]
    seeded, store = work / "seeded-disk", f"file://{work / 'store'}"
    warm = engine_for(spec, seeded, store)  # the replica that prefilled it first: saves it to disk and the store
    ask(warm, prompts[0])
    warm.close()  # its idle slot's state is written before the engine ends
    arms = {"prefill": lambda r: engine_for(spec, work / f"empty-{r}"),
            "restore": lambda r: engine_for(spec, seeded),
            "restore-cluster": lambda r: engine_for(spec, work / f"cluster-node-{r}", store)}
    results: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    for r in range(ns.rounds):
        order = list(arms) if r % 2 == 0 else list(reversed(arms))
        for arm in order:
            engine = arms[arm](r)
            try:
                replies = [ask(engine, p) for p in prompts]
            finally:
                engine.close()
            results[arm].append({"first": replies[0], "others": replies[1:]})
            log(f"round {r + 1} {arm}: first token {replies[0]['ttft_s'] * 1e3:.0f} ms "
                f"({replies[0]['cached_tokens']} of {replies[0]['prompt_tokens']} reused, {replies[0]['from'] or '-'})")
    rows = []
    base = statistics.median(x["first"]["ttft_s"] for x in results["prefill"])
    for arm, runs in results.items():
        firsts = [x["first"]["ttft_s"] for x in runs]
        others = [o["ttft_s"] for x in runs for o in x["others"]]
        rows.append({"arm": arm, "first_ttft_ms": statistics.median(firsts) * 1e3,
                     "x_prefill": statistics.median(firsts) / base,
                     "others_ttft_ms": statistics.median(others) * 1e3 if others else None,
                     "prompt_tokens": runs[0]["first"]["prompt_tokens"],
                     "reused": statistics.median(x["first"]["cached_tokens"] for x in runs),
                     "from": runs[0]["first"]["from"] or "-"})
    return rows


def decode_rate(engine: LlamaEngine, prompts: list[str], streams: int, tokens: int = 96) -> float:
    """Generated tokens per second with `streams` requests at once (no prompt reuse counted: each differs)."""
    boxes: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    threads = [threading.Thread(target=lambda p=p: boxes.append(ask(engine, p, tokens))) for p in prompts[:streams]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(b["tokens"] for b in boxes) / (time.perf_counter() - t0)


def compare(base: list[TokenLogprob], other: list[TokenLogprob]) -> dict[str, Any]:
    """Where two greedy replies part: `equal`, `tie` (the base's top two tokens within TIE_NATS there) or `other`,
    the base's top-two gap there, and the most a token's log-probability moved before they parted (how far the
    other KV type moves the model's numbers on the same text)."""
    i = next((i for i, (a, b) in enumerate(zip(base, other)) if a.token != b.token), None)
    shift = max((abs(a.logprob - b.logprob) for a, b in zip(base[:i], other[:i])), default=0.0)
    if i is None:
        return {"verdict": "equal", "gap": None, "shift": shift}
    top = base[i].top
    gap = top[0][1] - top[1][1] if len(top) >= 2 else None
    return {"verdict": "tie" if gap is not None and gap < TIE_NATS else "other", "gap": gap, "shift": shift}


def types(ns: argparse.Namespace, spec: Any) -> list[dict[str, Any]]:
    questions = [chat(spec, "You are a helpful assistant.", f"{q} Please explain in detail.") for q in QUESTIONS]
    spec = dataclasses.replace(spec, n_seq_max=4)
    samples: dict[str, dict[str, list[float]]] = {k: {"bytes": [], "d1": [], "d4": [], "prefill": []}
                                                  for k in ("f16", "q8_0")}
    replies: dict[str, list[list[TokenLogprob]]] = {}
    for r in range(ns.rounds):
        for kind in (("f16", "q8_0") if r % 2 == 0 else ("q8_0", "f16")):
            engine = engine_for(spec, None, cache_type_k=kind, cache_type_v=kind)
            try:
                long = chat(spec, preamble(1500, engine), "Hello.")
                t0 = time.perf_counter()
                first = ask(engine, long, max_tokens=1)
                samples[kind]["prefill"].append(first["prompt_tokens"] / (time.perf_counter() - t0))
                deadline = time.monotonic() + 30  # the idle engine saves the slot's state to its prompt cache
                while not engine.stats()["prompt_cache"]["entries"] and time.monotonic() < deadline:
                    time.sleep(0.01)
                samples[kind]["bytes"].append(engine.stats()["prompt_cache"]["bytes"] / (first["prompt_tokens"] + 1))
                if kind not in replies:  # before the rates' batches: what differs is the KV type, not what ran before
                    replies[kind] = [ask(engine, q, 48, logprobs=2)["logprobs"] for q in questions[:16]]
                samples[kind]["d1"].append(decode_rate(engine, questions, 1))
                samples[kind]["d4"].append(decode_rate(engine, questions, 4))
            finally:
                engine.close()
        log(f"round {r + 1}: " + ", ".join(f"{k} decode {statistics.median(v['d1']):.0f} tok/s"
                                           for k, v in samples.items()))
    verdicts = [compare(a, b) for a, b in zip(replies["f16"], replies["q8_0"])]
    rows = []
    for kind, s in samples.items():
        rows.append({"kv_type": kind, "bytes_per_token": statistics.median(s["bytes"]),
                     "decode_1": statistics.median(s["d1"]), "decode_4": statistics.median(s["d4"]),
                     "prefill": statistics.median(s["prefill"])})
    f16 = rows[0]
    for row in rows:
        row.update(x_bytes=row["bytes_per_token"] / f16["bytes_per_token"], x_decode_1=row["decode_1"] / f16["decode_1"],
                   x_decode_4=row["decode_4"] / f16["decode_4"])
    kinds = [v["verdict"] for v in verdicts]
    rows[1]["greedy"] = {v: kinds.count(v) for v in ("equal", "tie", "other")}
    rows[1]["parted_at_gaps"] = sorted(round(v["gap"], 3) for v in verdicts if v["gap"] is not None)
    rows[1]["largest_shift"] = max(v["shift"] for v in verdicts)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kvcache", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--preamble-tokens", type=int, default=3500)
    p.add_argument("--conversations", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--parts", type=comma_names(PARTS), default=list(PARTS))
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    ns = p.parse_args(argv)
    start_run(ns.out)
    spec = bundled_spec(n_ctx=ns.preamble_tokens + 512, n_seq_max=2, n_threads=ns.threads, n_gpu_layers=0,
                        kv_cache={"min_tokens": 64})
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-kvcache-") as tmp:
        if "cold" in ns.parts:
            rows = out["cold"] = cold(ns, spec, Path(tmp))
            print(f"\nA cold replica's first request: a {rows[0]['prompt_tokens']}-token prompt whose preamble "
                  f"{ns.conversations} conversations share (median of {ns.rounds} rounds)")
            print("\n".join(text_table(
                ["arm", "first TTFT ms", "x prefill", "reused", "from", "next convs TTFT ms"],
                [[r["arm"], fmt(r["first_ttft_ms"]), fmt(r["x_prefill"], ".2f"), fmt(r["reused"]), r["from"],
                  fmt(r["others_ttft_ms"])] for r in rows])))
        if "types" in ns.parts:
            rows = out["types"] = types(ns, spec)
            print(f"\nKV cache types (median of {ns.rounds} rounds); greedy replies of q8_0 against f16: "
                  f"{rows[1]['greedy']}, parted where f16's top two were {rows[1]['parted_at_gaps']} nats apart; "
                  f"a token's log-probability moved up to {rows[1]['largest_shift']:.3f} nats before they parted")
            print("\n".join(text_table(
                ["KV type", "bytes/token", "x f16", "decode tok/s 1", "x f16", "decode tok/s 4", "x f16", "prefill tok/s"],
                [[r["kv_type"], fmt(r["bytes_per_token"]), fmt(r["x_bytes"], ".2f"), fmt(r["decode_1"]),
                  fmt(r["x_decode_1"], ".2f"), fmt(r["decode_4"]), fmt(r["x_decode_4"], ".2f"), fmt(r["prefill"])]
                 for r in rows])))
    write_run(ns.out / "kvcache.json", ns, **out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
