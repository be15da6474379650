"""python -m bench.llguidance_masks: what llguidance would cost on our vocabulary, against llama.cpp's grammar.

    .venv/bin/python -m bench.llguidance_masks   (needs `pip install llguidance==1.9.1`; not a dependency yet)

For each workload of bench.structured (its schema, or its GBNF grammar), a valid reply is tokenized with the
bundled model's vocabulary and walked token by token. Per token, median / p99 / max in microseconds:
  - `gbnf_full`: llama.cpp's grammar (ours, from app/grammar) applied to the whole vocabulary (the slow path,
    and every token of the grammar-first order);
  - `gbnf_check`: the same grammar checking the one sampled token (the fast path of the token-first order);
  - `llg_mask`: llguidance computing the whole vocabulary's bitmask;
plus each side's compile (schema -> GBNF and llama_sampler_init_grammar; llguidance's schema -> grammar and
LLMatcher) in ms, and llguidance's tokenizer built from the vocabulary once (ms). Single thread, no model run.
"""

from __future__ import annotations

import ctypes
import json
import statistics
import time
from typing import Any

import numpy as np
from llama_cpp import llama_sampler_accept, llama_sampler_apply

from app.config.settings import ModelConfig, resolve_model
from app.engine import SamplingParams
from app.engine.llama import LlamaModelContext, SamplerChain, _Candidates
from app.grammar.request_grammars import json_grammar, tool_call_schema

from .structured import GBNF, MODEL, big_schema, small_schema, tools


def instances() -> dict[str, tuple[str, str, str]]:
    """name -> (our GBNF grammar, llguidance grammar, a valid reply)."""
    small = {"name": "Ann Lee", "age": 41, "address": {"city": "Oslo", "zip": "0150"}, "tags": ["a", "b"],
             "active": True}
    big = {f"group{g}": {f"s{g}": "x", f"i{g}": g, f"n{g}": 1.5, f"b{g}": False, f"e{g}": "mid"} for g in range(10)}
    defs = tools()
    call_schema = {"anyOf": [tool_call_schema(t["function"]["name"], t["function"]["parameters"]) for t in defs]}
    call = {"name": "find_3", "arguments": {"q": "item 7"}}
    out = {}
    for name, schema, value in (("json-small", small_schema(), small), ("json-50", big_schema(), big),
                                ("tools-20 (the call's JSON)", call_schema, call)):
        out[name] = (json_grammar(schema, "response_format"), json.dumps(schema), json.dumps(value))
    out["gbnf"] = (GBNF, GBNF, "- Apple\n- Banana pie\n- Cherry")
    return out


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    import llguidance
    from llguidance import LLMatcher
    from llguidance.llamacpp import lltokenizer_from_vocab

    spec = resolve_model(ModelConfig(id="smollm2-135m", model_path=MODEL))
    llama = LlamaModelContext(spec.path, n_ctx_per_seq=256, n_seq_max=1, n_batch=64, n_threads=1,
                              n_threads_batch=1, n_gpu_layers=0, kv_unified=True)
    t0 = time.perf_counter()
    tok = lltokenizer_from_vocab(llama.vocab)
    tokenizer_ms = (time.perf_counter() - t0) * 1000
    zeros = np.zeros(llama.n_vocab, dtype=np.float32)
    logits = zeros.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    cands = _Candidates(llama.n_vocab)
    words = (llama.n_vocab + 31) // 32
    mask = np.full(words, -1, dtype=np.int32)
    report: dict[str, Any] = {"llguidance": llguidance.__version__, "n_vocab": llama.n_vocab,
                              "tokenizer_ms": round(tokenizer_ms, 1), "workloads": {}}
    for name, (gbnf, llg_source, reply) in instances().items():
        tokens = llama.tokenize(reply, add_special=False)
        # llama.cpp: compile, then per token the whole vocabulary, and the one token
        t0 = time.perf_counter()
        if name.startswith(("json", "tools")):
            gbnf = json_grammar(json.loads(llg_source), "response_format")
        chain = SamplerChain(llama, SamplingParams(temperature=0.0, grammar=gbnf))
        gbnf_compile = (time.perf_counter() - t0) * 1000
        full, check = [], []
        for token in tokens:
            cur = cands.load(logits)
            t0 = time.perf_counter()
            llama_sampler_apply(chain.grammar, ctypes.byref(cur))
            full.append((time.perf_counter() - t0) * 1e6)
            t0 = time.perf_counter()
            ok = chain._allows(token)
            check.append((time.perf_counter() - t0) * 1e6)
            if not ok:
                raise RuntimeError(f"{name}: our grammar rejects the reply at {llama.piece(token)!r}")
            llama_sampler_accept(chain.grammar, token)
        chain.free()
        # llguidance
        t0 = time.perf_counter()
        grammar = llguidance.grammar_from("gbnf" if name == "gbnf" else "json_schema", llg_source)
        matcher = LLMatcher(tok, grammar, log_level=0)
        llg_compile = (time.perf_counter() - t0) * 1000
        if matcher.is_error():
            raise RuntimeError(f"{name}: llguidance: {matcher.get_error()}")
        masks = []
        for token in tokens:
            t0 = time.perf_counter()
            matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
            masks.append((time.perf_counter() - t0) * 1e6)
            if not (int(mask[token // 32]) >> (token % 32)) & 1:
                raise RuntimeError(f"{name}: llguidance's mask rules out {llama.piece(token)!r}")
            if not matcher.consume_token(token):
                raise RuntimeError(f"{name}: llguidance refused {llama.piece(token)!r}: {matcher.get_error()}")
        row = {"tokens": len(tokens), "compile_ms": {"gbnf": round(gbnf_compile, 2), "llguidance": round(llg_compile, 2)},
               "accepting_at_end": matcher.is_accepting()}
        for key, xs in (("gbnf_full_us", full), ("gbnf_check_us", check), ("llg_mask_us", masks)):
            row[key] = {"median": round(statistics.median(xs), 1), "p99": round(pct(xs, 0.99), 1), "max": round(max(xs), 1)}
        report["workloads"][name] = row
        print(json.dumps({name: row}), flush=True)
    llama.close()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
