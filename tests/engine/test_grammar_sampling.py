"""The grammar checks the token the chain sampled without it, and is applied to the whole vocabulary only
when it rejects that token: replies still always follow the grammar, greedy replies pick what the
grammar-first order picks, and a model that follows the grammar never takes the slow path. On the
bundled model, through the sampler itself (one sequence of a context of its own)."""

from __future__ import annotations

import re

import pytest

from app.engine import SamplingParams
from app.engine import llama as llama_mod
from app.engine.llama import Batch, LlamaModelContext, NoValidToken, SamplerChain, decode
from app.prompt.chat_template import render_prompt

pytestmark = pytest.mark.model

GREEDY = dict(temperature=0.0)


@pytest.fixture(scope="module")
def llama(bundled_spec):
    ctx = LlamaModelContext(bundled_spec.path, n_ctx_per_seq=512, n_seq_max=1, n_batch=256, n_threads=2,
                            n_threads_batch=2, n_gpu_layers=0, kv_unified=True)
    yield ctx
    ctx.close()


@pytest.fixture(scope="module")
def prompt(llama, bundled_spec):
    text = render_prompt(bundled_spec.chat_template, [{"role": "user", "content": "Say hello to the world."}])
    return llama.tokenize_prompt(text)


def sampler(llama, grammar_first: bool = False, **params) -> SamplerChain:
    old, llama_mod.GRAMMAR_FIRST = llama_mod.GRAMMAR_FIRST, grammar_first
    try:
        return SamplerChain(llama, SamplingParams(**params))
    finally:
        llama_mod.GRAMMAR_FIRST = old


def generate(llama, prompt: list[int], samplers: list[SamplerChain], n: int) -> tuple[list[list[int]], list[int]]:
    """Up to `n` tokens, each sampler choosing from the same logits at each step; the first one's token
    is fed back (so the others must agree with it for their grammars to stay in step). Each sampler's
    tokens, and each sampler's count of tokens it took the slow path for (the samplers are freed here)."""
    llama.seq_rm(0, 0, -1)
    batch = Batch(len(prompt))
    out: list[list[int]] = [[] for _ in samplers]
    slow: list[int] = []
    try:
        for i, token in enumerate(prompt):
            batch.add(token, i, 0, i == len(prompt) - 1)
        for step in range(n):
            assert decode(llama, batch) == 0
            tokens = [s.sample(batch.n - 1) for s in samplers]
            for seen, token in zip(out, tokens):
                seen.append(token)
            if llama.is_eog(tokens[0]):
                break
            batch.clear()
            batch.add(tokens[0], len(prompt) + step, 0, True)
    finally:
        batch.free()
        slow[:] = [s.slow_path_tokens for s in samplers]
        for s in samplers:
            s.free()
    return out, slow


def text(llama, tokens: list[int]) -> str:
    return llama.detokenize([t for t in tokens if not llama.is_eog(t)])


def test_a_grammar_the_model_would_not_follow_still_forces_its_output(llama, prompt):
    grammar = 'root ::= "QX" [0-9]{4} "!"'
    (free,), _ = generate(llama, prompt, [sampler(llama, **GREEDY)], 1)
    probe = sampler(llama, grammar=grammar, **GREEDY)
    try:
        assert not probe._allows(free[0])  # the premise: the model's own first choice breaks the grammar
    finally:
        probe.free()
    (tokens,), slow = generate(llama, prompt, [sampler(llama, grammar=grammar, **GREEDY)], 16)
    assert re.fullmatch(r"QX[0-9]{4}!", text(llama, tokens)), text(llama, tokens)
    assert llama.is_eog(tokens[-1])  # the grammar complete, only the end of the reply is allowed
    assert slow[0] >= 1  # the rejected greedy token went through the whole-vocabulary path


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sampled_replies_always_follow_the_grammar(llama, prompt, seed):
    grammar = 'root ::= "{\\"n\\": " [0-9]{1,3} ", \\"w\\": \\"" [a-z]{1,8} "\\"}"'
    (tokens,), _ = generate(llama, prompt, [sampler(llama, grammar=grammar, temperature=1.0, top_k=0, min_p=0.0,
                                               seed=seed)], 40)
    assert re.fullmatch(r'\{"n": [0-9]{1,3}, "w": "[a-z]{1,8}"\}', text(llama, tokens)), text(llama, tokens)


def test_greedy_picks_what_the_grammar_first_order_picks(llama, prompt):
    grammar = 'root ::= "Hello" [a-z ,!]{1,30} "."'
    fast = sampler(llama, grammar=grammar, **GREEDY)
    first = sampler(llama, grammar_first=True, grammar=grammar, **GREEDY)
    (a, b), _ = generate(llama, prompt, [fast, first], 40)
    assert a == b
    assert re.fullmatch(r"Hello[a-z ,!]{1,30}\.", text(llama, a)), text(llama, a)


def test_a_model_that_follows_the_grammar_never_takes_the_slow_path(llama, prompt):
    for grammar_first in (False, True):
        chain = sampler(llama, grammar_first=grammar_first, grammar="root ::= .*", temperature=0.8, seed=5)
        (tokens,), slow = generate(llama, prompt, [chain], 12)
        # grammar-first matches the vocabulary every token; checking the sampled token, never here
        assert slow == [len(tokens) if grammar_first else 0]


@pytest.mark.parametrize("grammar_first", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_grammar_no_token_satisfies_raises_in_either_order(llama, prompt, grammar_first, temperature):
    chain = sampler(llama, grammar_first=grammar_first, grammar="root ::= [^\\x00-\\U0010FFFF]",
                    temperature=temperature, seed=1)
    with pytest.raises(NoValidToken):
        generate(llama, prompt, [chain], 2)


def test_advance_checks_each_token_against_the_grammar(llama):
    fits = llama.tokenize("yes", add_special=False)
    chain = sampler(llama, grammar='root ::= "yes" | "no"', **GREEDY)
    try:
        assert chain.advance(fits)
        assert not chain._allows(fits[0])  # the grammar moved past "yes": only the end remains
    finally:
        chain.free()
    chain = sampler(llama, grammar='root ::= "no"', **GREEDY)
    try:
        assert not chain.advance(fits)
    finally:
        chain.free()
