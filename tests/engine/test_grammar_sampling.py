"""The grammar's mask is the sampler's first stage: replies always follow the grammar, greedy replies are
the best token the grammar allows, continued replies are checked token by token, and a grammar that
leaves no token fails the request (never the process). On the bundled model, through the sampler itself
(one sequence of a context of its own), with llguidance's matcher as the grammar."""

from __future__ import annotations

import re

import llama_cpp as L
import numpy as np
import pytest

from app.engine import SamplingParams
from app.engine.constraint import Constraint, MaskWorker, grammar_tokenizer
from app.engine.llama import Batch, LlamaModelContext, NoValidToken, SamplerChain, decode
from app.prompt.chat_template import render_prompt
from tests.support.grammars import gbnf
from tests.support.engine_errors import client_error

pytestmark = pytest.mark.model

GREEDY = dict(temperature=0.0)


@pytest.fixture(scope="module")
def llama(bundled_spec):
    ctx = LlamaModelContext(bundled_spec.path, n_ctx_per_seq=512, n_seq_max=1, n_batch=256, n_threads=2,
                            n_threads_batch=2, n_gpu_layers=0, kv_unified=True)
    yield ctx
    ctx.close()


@pytest.fixture(scope="module")
def tokenizer(llama):
    return grammar_tokenizer(llama.vocab)


@pytest.fixture(scope="module")
def prompt(llama, bundled_spec):
    text = render_prompt(bundled_spec.chat_template, [{"role": "user", "content": "Say hello to the world."}])
    return llama.tokenize_prompt(text)


def generate(llama, prompt: list[int], chain: SamplerChain, n: int, before_sample=None, after_sample=None) -> list[int]:
    """Up to `n` tokens from `chain` (freed here)."""
    llama.seq_rm(0, 0, -1)
    batch = Batch(len(prompt))
    out: list[int] = []
    try:
        for i, token in enumerate(prompt):
            batch.add(token, i, 0, i == len(prompt) - 1)
        for step in range(n):
            assert decode(llama, batch) == 0
            if before_sample is not None:
                before_sample(batch.n - 1)
            token = chain.sample(batch.n - 1)
            out.append(token)
            if after_sample is not None:
                after_sample(token)
            if llama.is_eog(token):
                break
            batch.clear()
            batch.add(token, len(prompt) + step, 0, True)
    finally:
        batch.free()
        chain.free()
    return out


def text(llama, tokens: list[int]) -> str:
    return llama.detokenize([t for t in tokens if not llama.is_eog(t)])


def test_a_grammar_the_model_would_not_follow_still_forces_its_output(llama, tokenizer, prompt):
    grammar = gbnf('root ::= "QX" [0-9]{4} "!"')
    free = generate(llama, prompt, SamplerChain(llama, SamplingParams(**GREEDY)), 1)
    probe = Constraint(tokenizer, grammar, llama.n_vocab)
    assert probe.matcher.validate_tokens(free) == 0  # the premise: the model's own first choice breaks it
    tokens = generate(llama, prompt, SamplerChain(llama, SamplingParams(grammar=grammar, **GREEDY), tokenizer), 16)
    assert re.fullmatch(r"QX[0-9]{4}!", text(llama, tokens)), text(llama, tokens)
    assert llama.is_eog(tokens[-1])  # the grammar complete, only the end of the reply is allowed


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sampled_replies_always_follow_the_grammar(llama, tokenizer, prompt, seed):
    grammar = gbnf('root ::= "{\\"n\\": " [0-9]{1,3} ", \\"w\\": \\"" [a-z]{1,8} "\\"}"')
    chain = SamplerChain(llama, SamplingParams(grammar=grammar, temperature=1.0, top_k=0, min_p=0.0, seed=seed),
                         tokenizer)
    tokens = generate(llama, prompt, chain, 40)
    assert re.fullmatch(r'\{"n": [0-9]{1,3}, "w": "[a-z]{1,8}"\}', text(llama, tokens)), text(llama, tokens)


def test_greedy_takes_the_most_likely_token_the_grammar_allows(llama, tokenizer, prompt):
    """Each step's token is the argmax of the raw logits over the tokens the grammar allows there (each
    checked one by one against a matcher walked alongside: not through the mask the sampler uses)."""
    grammar = gbnf('root ::= "Hello" [a-z ,!]{1,30} "."')
    judge = Constraint(tokenizer, grammar, llama.n_vocab)
    candidates = range(llama.n_vocab)
    picks: list[tuple[int, int]] = []

    def best_allowed(row: int) -> None:
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(llama.ctx, row), shape=(llama.n_vocab,)).copy()
        allowed = [t for t in candidates if judge.matcher.validate_tokens([t]) == 1]
        picks.append((row, max(allowed, key=lambda t: logits[t])))

    def follow(token: int) -> None:
        if not llama.is_eog(token):
            judge.matcher.consume_token(token)

    chain = SamplerChain(llama, SamplingParams(grammar=grammar, **GREEDY), tokenizer)
    tokens = generate(llama, prompt, chain, 6, before_sample=best_allowed, after_sample=follow)
    assert [expected for _, expected in picks] == tokens
    assert text(llama, tokens).startswith("Hello") or "Hello".startswith(text(llama, tokens))


def test_a_grammar_no_token_can_start_is_refused_when_built(llama, tokenizer):
    with client_error() as err:
        SamplerChain(llama, SamplingParams(grammar=gbnf("root ::= [^\\x00-\\U0010FFFF]")), tokenizer)
    assert err.value.status == 400 and err.value.code == "grammar_unsatisfiable"


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_grammar_no_token_can_go_on_raises_at_that_token(llama, tokenizer, prompt, temperature):
    chain = SamplerChain(llama, SamplingParams(grammar=gbnf('root ::= "a" [^\\x00-\\U0010FFFF]'),
                                               temperature=temperature, seed=1), tokenizer)
    with pytest.raises(NoValidToken):
        generate(llama, prompt, chain, 3)


def test_advance_checks_each_token_against_the_grammar(llama, tokenizer):
    fits = llama.tokenize("yes", add_special=False)
    chain = SamplerChain(llama, SamplingParams(grammar=gbnf('root ::= "yes" | "no"'), **GREEDY), tokenizer)
    try:
        assert chain.advance(fits)
        assert chain.constraint.matcher.is_accepting()  # past "yes": only the end remains
    finally:
        chain.free()
    chain = SamplerChain(llama, SamplingParams(grammar=gbnf('root ::= "no"'), **GREEDY), tokenizer)
    try:
        assert not chain.advance(fits)
    finally:
        chain.free()


def test_the_mask_worker_fills_stale_masks_once(llama, tokenizer):
    grammar = gbnf('root ::= "a" [0-9]+')
    fresh, stale = Constraint(tokenizer, grammar, llama.n_vocab), Constraint(tokenizer, grammar, llama.n_vocab)
    fresh.fill()
    before = fresh.mask.copy()
    fresh.mask[:] = 0  # were it filled again, it would hold the grammar's mask again
    worker = MaskWorker()
    try:
        worker.wait(worker.start([fresh, stale]))
    finally:
        worker.close()
    assert stale.fresh and np.array_equal(stale.mask, before)
    assert not fresh.mask.any()
    assert worker.start([fresh, stale]) is None  # nothing stale: no work handed to the thread
