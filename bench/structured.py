"""python -m bench.structured: constrained decoding against the same requests unconstrained, on the engine.

    .venv/bin/python -m bench.structured [--concurrency 1,16] [--rounds 3] [--max-tokens 160] [--mix N]
        [--workloads json-small,json-50,tools-20,gbnf] [--threads 2] [--out FILE.json]

Workloads (greedy, one prompt text per request so nothing is shared): `json-small`, a strict 5-property
nested response_format schema; `json-50`, a 50-property nested one; `tools-20`, `tool_choice: required`
over 20 tools (the grammar and prompt that plan_tools makes); `gbnf`, a client GBNF grammar. Each runs in
two variants on one engine: `plain` (no grammar) and `constrained` (its grammar: llguidance's mask, computed
beside the decode, applied before the sampler chain). The variants take turns within each round, their
order alternating round by round (this machine's speed moves over minutes); each cell is the median over
the rounds. Per cell: the decode rate while all `c` streams of a wave generate (tokens per second from
the last stream's first token to the first stream's end: the same batch in both variants), the wave's
completion tok/s (all its tokens over its wall time: shorter constrained replies and prefill move it), TTFT (median over
requests; it includes the request's grammar compile, as the server pays it), the engine thread's CPU time
in sampling per token (thread_time: less moved by other processes than wall time), and how many finished
replies are valid (jsonschema) against their schema. `compile_ms`: the request's grammar made (schema ->
llguidance grammar, our limits, its check) and its matcher built, median of 5.

The llama.cpp grammar sampler this replaced is measured by the same command on a checkout before it
(290d62a: variants `before`, the grammar over the whole vocabulary every token, and `after`, the sampled
token checked first); docs/benchmarks.md has both tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import jsonschema

from app.api.schemas import ChatCompletionRequest
from app.generation.plan import client_gbnf
from app.config.app_args import Limits
from app.engine import GenerationRequest, LlamaEngine, SamplingParams, hardware
from app.engine import llama as llama_mod
from app.engine.events import Failed, Finished, Text
from app.grammar.request_grammars import json_grammar, tool_call_schema
from app.prompt.chat_template import render_prompt
from app.prompt.tool_calling import plan_tools, resolve_reply_format

from .harness.bundled import bundled_spec

VARIANTS = ("plain", "constrained")


def small_schema() -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False,
            "required": ["name", "age", "address", "tags", "active"],
            "properties": {
                "name": {"type": "string", "maxLength": 24},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "address": {"type": "object", "additionalProperties": False, "required": ["city", "zip"],
                            "properties": {"city": {"type": "string", "maxLength": 24},
                                           "zip": {"type": "string", "maxLength": 8}}},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
                "active": {"type": "boolean"}}}


def big_schema() -> dict[str, Any]:
    """50 leaf properties: 10 nested objects of 5 (string, integer, number, boolean, enum)."""
    def group(g: int) -> dict[str, Any]:
        props = {f"s{g}": {"type": "string", "maxLength": 16}, f"i{g}": {"type": "integer"},
                 f"n{g}": {"type": "number"}, f"b{g}": {"type": "boolean"},
                 f"e{g}": {"enum": ["low", "mid", "high"]}}
        return {"type": "object", "additionalProperties": False, "required": list(props), "properties": props}
    props = {f"group{g}": group(g) for g in range(10)}
    return {"type": "object", "additionalProperties": False, "required": list(props), "properties": props}


def tools(n: int = 20) -> list[dict[str, Any]]:
    """Small ones, so 16 prompts of all 20 fit the context and their prefill does not swamp the decode."""
    return [{"type": "function", "function": {
        "name": f"find_{k}", "parameters": {"type": "object", "additionalProperties": False, "required": ["q"],
                                            "properties": {"q": {"type": "string", "maxLength": 24}}}}}
        for k in range(n)]


GBNF = r'''root ::= "- " item ("\n- " item){2,5}
item ::= [A-Z] [a-z ]{2,30}'''


@dataclass
class Workload:
    name: str
    build: Callable[[str, int], tuple[str, str]]  # (template, i) -> (prompt, grammar)
    check: Callable[[str], bool] | None           # a finished reply valid?


def _json_check(schema: dict[str, Any]) -> Callable[[str], bool]:
    def check(text: str) -> bool:
        try:
            jsonschema.validate(json.loads(text), schema)
            return True
        except (ValueError, jsonschema.ValidationError):
            return False
    return check


def _json_workload(name: str, schema: dict[str, Any], ask: str) -> Workload:
    def build(template: str, i: int) -> tuple[str, str]:
        prompt = render_prompt(template, [{"role": "user", "content": f"{ask} (record #{i})"}])
        return prompt, json_grammar(schema, "response_format")
    return Workload(name, build, _json_check(schema))


def _tools_workload() -> Workload:
    defs = tools()
    call_schema = {"anyOf": [tool_call_schema(t["function"]["name"], t["function"]["parameters"]) for t in defs]}
    valid = _json_check(call_schema)

    def build(template: str, i: int) -> tuple[str, str]:
        req = ChatCompletionRequest.model_validate({
            "model": "m", "messages": [{"role": "user", "content": f"Find item {i} of kind 3."}],
            "tools": defs, "tool_choice": "required"})
        plan = plan_tools(resolve_reply_format(template), req, [m.model_dump(exclude_none=True) for m in req.messages])
        return render_prompt(template, plan.messages, tools=plan.template_tools), plan.grammar or ""

    def check(text: str) -> bool:  # the call's JSON inside the parser's wrapping (<tool_call>...)
        return valid(text[text.find("{"):text.rfind("}") + 1])
    return Workload("tools-20", build, check)


def _list_prompt(template: str, i: int) -> str:
    return render_prompt(template, [{"role": "user", "content": f"List some fruits (list #{i})."}])


def _gbnf_workload() -> Workload:
    def build(template: str, i: int) -> tuple[str, str]:
        return _list_prompt(template, i), client_gbnf(GBNF, Limits())
    return Workload("gbnf", build, None)


WORKLOADS = {
    "json-small": _json_workload("json-small", small_schema(), "Describe a fictional person as JSON."),
    "json-50": _json_workload("json-50", big_schema(), "Fill in the measurement record as JSON."),
    "tools-20": _tools_workload(),
    "gbnf": _gbnf_workload(),
}

def request_fields(name: str) -> dict[str, Any]:
    """What a client sends for a workload, as the OpenAI API (and llama-server) take it."""
    if name == "json-small":
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "person", "strict": True,
                                                                            "schema": small_schema()}}}
    if name == "json-50":
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "record", "strict": True,
                                                                            "schema": big_schema()}}}
    if name == "tools-20":
        return {"tools": tools(), "tool_choice": "required"}
    return {"grammar": GBNF}


_sampling = {"cpu_s": 0.0}


def _count_sampling() -> None:
    """The engine thread's CPU time in sampling (thread_time: what another process's load on this shared
    machine does not add to)."""
    sample = llama_mod.SamplerChain.sample

    def timed(self, batch_index: int) -> int:
        t0 = time.thread_time()
        try:
            return sample(self, batch_index)
        finally:
            _sampling["cpu_s"] += time.thread_time() - t0
    llama_mod.SamplerChain.sample = timed


def wave(engine: LlamaEngine, work: Workload, variant: str, n: int, max_tokens: int, first: int) -> dict[str, Any]:
    """n requests submitted together; each pays its grammar's compile on the submitting thread, as the
    server's prepare does."""
    lock = threading.Lock()
    done = [threading.Event() for _ in range(n)]
    first_text: dict[int, float] = {}
    started: dict[int, float] = {}
    texts: dict[int, list[str]] = {k: [] for k in range(n)}
    ends: dict[int, Any] = {}
    ended: dict[int, float] = {}
    produced: list[tuple[float, int]] = []  # (when, tokens) of every Text event

    def sink_for(k: int):
        def sink(ev: Any) -> None:
            now = time.perf_counter()
            with lock:
                if isinstance(ev, Text):
                    first_text.setdefault(k, now)
                    texts[k].append(ev.text)
                    produced.append((now, ev.tokens))
                if isinstance(ev, (Finished, Failed)):
                    ends[k] = ev
                    ended[k] = now
                    done[k].set()
        return sink

    _sampling["cpu_s"] = 0.0
    t0 = time.perf_counter()
    for k in range(n):
        started[k] = time.perf_counter()
        prompt, grammar = work.build(engine.spec.chat_template, first + k)
        sampling = SamplingParams(temperature=0.0, grammar=None if variant == "plain" else grammar)
        engine.submit(engine.prepare(GenerationRequest(request_id=f"{work.name}-{variant}-{first + k}", prompt=prompt,
                                                       max_tokens=max_tokens, sampling=sampling), sink_for(k)))
    for event in done:
        event.wait()
    wall = time.perf_counter() - t0
    failed = [e for e in ends.values() if isinstance(e, Failed)]
    if failed:
        raise RuntimeError(f"{work.name}/{variant}: {failed[0]}")
    tokens = sum(e.completion_tokens for e in ends.values())
    finished = [k for k, e in ends.items() if e.finish_reason == "stop"]
    valid = sum(1 for k in finished if work.check is None or work.check("".join(texts[k])))
    # Decode rate while all n streams generate (from the last one's first token to the first one's end):
    # the same batch either way, unlike the wave's tok/s, which a grammar's shorter replies and the
    # prompts' prefill move.
    lo, hi = max(first_text.values()), min(ended.values())
    in_window = sum(t for when, t in produced if lo < when <= hi)
    return {"tok_s": tokens / wall, "tokens": tokens,
            "decode_tok_s": in_window / (hi - lo) if hi > lo and in_window else float("nan"),
            "ttft_ms": statistics.median((first_text[k] - started[k]) * 1000 for k in first_text),
            "sample_cpu_ms": 1000 * _sampling["cpu_s"] / max(1, tokens),
            "finished": len(finished), "valid": valid}


def mixed_wave(engine: LlamaEngine, work: Workload, constrained: bool, n: int, max_tokens: int,
               first: int) -> list[float]:
    """n plain streams beside n others (`work`'s requests, with their grammar when `constrained`), all
    submitted together: the plain streams' gaps between tokens (s), while the others still generate."""
    lock = threading.Lock()
    total = 2 * n
    done = [threading.Event() for _ in range(total)]
    stamps: dict[int, list[float]] = {k: [] for k in range(n)}
    others_end: list[float] = []

    def sink_for(k: int):
        def sink(ev: Any) -> None:
            with lock:
                if isinstance(ev, Text) and k < n:
                    stamps[k].append(time.perf_counter())
                if isinstance(ev, (Finished, Failed)):
                    if k >= n:
                        others_end.append(time.perf_counter())
                    done[k].set()
        return sink

    template = engine.spec.chat_template
    for k in range(total):
        if k < n:  # the gbnf workload's prompt, without its grammar
            prompt, grammar = _list_prompt(template, first + k), None
        else:
            prompt, grammar = work.build(template, first + k)
        sampling = SamplingParams(temperature=0.0, grammar=grammar if (constrained and k >= n) else None)
        engine.submit(engine.prepare(GenerationRequest(request_id=f"mix-{first + k}", prompt=prompt,
                                                       max_tokens=max_tokens, sampling=sampling), sink_for(k)))
    for event in done:
        event.wait()
    until = min(others_end) if others_end else float("inf")
    return [b - a for ts in stamps.values() for a, b in zip(ts, ts[1:]) if b <= until]


def run_mix(engine: LlamaEngine, works: list[Workload], n: int, rounds: int, max_tokens: int) -> str:
    """The plain streams' inter-token gaps (p50 / p99 / max ms) beside plain and beside constrained
    neighbours, per workload, the two taking turns round by round."""
    lines = [f"| neighbours ({n} plain streams beside {n} of them) | gap p50 ms | gap p99 ms | gap max ms |",
             "|---|---|---|---|"]
    serial = 0
    for work in works:
        gaps: dict[bool, list[float]] = {False: [], True: []}
        for r in range(rounds):
            for constrained in ((False, True) if r % 2 == 0 else (True, False)):
                serial += 1
                gaps[constrained] += mixed_wave(engine, work, constrained, n, max_tokens, 50_000 + serial * 100)
        for constrained, xs in gaps.items():
            xs = sorted(xs)
            label = f"{work.name}, {'constrained' if constrained else 'unconstrained'}"
            lines.append(f"| {label} | {1000 * xs[len(xs) // 2]:.1f} | {1000 * xs[min(len(xs) - 1, int(0.99 * len(xs)))]:.1f} "
                         f"| {1000 * xs[-1]:.1f} |")
    return "\n".join(lines)


def compile_ms(engine: LlamaEngine, work: Workload) -> float:
    times = []
    for i in range(5):
        t0 = time.perf_counter()
        _, grammar = work.build(engine.spec.chat_template, i)
        chain = llama_mod.SamplerChain(engine.llama, SamplingParams(temperature=0.0, grammar=grammar),
                                       engine.grammar_tokenizer())
        times.append((time.perf_counter() - t0) * 1000)
        chain.free()
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.structured", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="also write the results here (JSON)")
    ap.add_argument("--masks", choices=("auto", "beside", "after"), default="auto",
                    help="grammar masks computed beside the decode, or by the sampler (a greedy token checked "
                         "first); auto: as the server decides (beside where a core is free for them)")
    ap.add_argument("--mix", type=int, default=0, metavar="N",
                    help="instead: N plain streams beside N of each workload's requests, unconstrained and "
                         "constrained in turn; prints the plain streams' inter-token gaps")
    ap.add_argument("--body", choices=list(WORKLOADS), default=None,
                    help="print the request fields of this workload (for `python -m bench --extra-body`) and exit")
    ns = ap.parse_args(argv)
    if ns.body:
        print(json.dumps(request_fields(ns.body)))
        return
    levels = [int(c) for c in ns.concurrency.split(",")]
    works = [WORKLOADS[w] for w in ns.workloads.split(",")]
    spec = bundled_spec(n_ctx=2048, n_seq_max=2 * ns.mix if ns.mix else max(levels), n_threads=ns.threads,
                        stream_interval_ms=0)
    _count_sampling()
    engine = LlamaEngine(spec).start()
    engine.spec = spec
    if ns.masks != "auto":
        engine.masks_beside_decode = ns.masks == "beside"
    engine.grammar_tokenizer()  # built once per replica, before its first grammar: not a request's TTFT
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    if ns.mix:
        try:
            wave(engine, works[0], "plain", 1, 16, 90_000)  # warm-up
            print(run_mix(engine, works, ns.mix, ns.rounds, ns.max_tokens))
        finally:
            engine.close()
        return
    try:
        wave(engine, works[0], "plain", 1, 16, 90_000)  # warm-up
        serial = 0
        for r in range(ns.rounds):
            for work in works:
                for c in levels:
                    order = VARIANTS[r % 2:] + VARIANTS[:r % 2]
                    for variant in order:
                        serial += 1
                        row = wave(engine, work, variant, c, ns.max_tokens, serial * 100)
                        results.setdefault(f"{work.name} c={c}", {}).setdefault(variant, []).append(row)
                        print(json.dumps({"round": r, "cell": f"{work.name} c={c}", "variant": variant,
                                          **{k: round(v, 3) for k, v in row.items()}}), flush=True)
        compiles = {w.name: round(compile_ms(engine, w), 2) for w in works}
    finally:
        engine.close()
    table = summarize(results, compiles)
    meta = {"cpu_backend": hardware.cpu_backend(), "threads": ns.threads, "rounds": ns.rounds,
            "max_tokens": ns.max_tokens, "compile_ms": compiles}
    print(json.dumps(meta))
    print(table)
    if ns.out:
        with open(ns.out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)


def summarize(results: dict[str, dict[str, list[dict[str, Any]]]], compiles: dict[str, float]) -> str:
    def med(rows: list[dict[str, Any]], key: str) -> float:
        return statistics.median(row[key] for row in rows)

    lines = ["| workload | c | decode tok/s plain | decode tok/s constrained | wave tok/s plain / constrained "
             "| TTFT ms plain / constrained | sampling CPU ms/token plain / constrained | valid / finished "
             "| compile ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for cell, variants in results.items():
        name, c = cell.rsplit(" c=", 1)
        plain, constrained = (med(variants[v], "decode_tok_s") for v in VARIANTS)
        wave_rate = " / ".join(f"{med(variants[v], 'tok_s'):.1f}" for v in VARIANTS)
        ttft = " / ".join(f"{med(variants[v], 'ttft_ms'):.0f}" for v in VARIANTS)
        cpu = " / ".join(f"{med(variants[v], 'sample_cpu_ms'):.2f}" for v in VARIANTS)
        rows = variants["constrained"]
        lines.append(
            f"| {name} | {c} | {plain:.1f} | {constrained:.1f} ({constrained / plain:.2f}x) | {wave_rate} | {ttft} | {cpu} "
            f"| {sum(r['valid'] for r in rows)} / {sum(r['finished'] for r in rows)} "
            f"| {compiles.get(name, float('nan')):.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
