"""A grammar whose ambiguity grows with the reply (no static bound sees it) stops its own request once
its matching time goes past the budget, and the others go on."""

from __future__ import annotations

import pytest

from app.engine import GenerationRequest, SamplingParams
from app.engine import llama as llama_mod
from app.engine.events import Failed, Finished
from tests.support.events import EventBox, run_until_idle, wait_idle


def test_a_grammar_past_its_time_budget_fails_its_request_only(engine, bundled_spec, monkeypatch):
    # The budget made tiny, so an ordinary grammar goes past it: the guard, not a slow grammar, is tested.
    monkeypatch.setattr(llama_mod, "GRAMMAR_ALLOWANCE_S", 0.0)
    monkeypatch.setattr(llama_mod, "GRAMMAR_EXCESS_BUDGET_S", 1e-6)
    slow, plain = EventBox(), EventBox()
    engine.submit(engine.prepare(GenerationRequest("slow", "Say yes.", max_tokens=8,
                                                   sampling=SamplingParams(grammar='root ::= [a-z ]{1,8}')), slow))
    engine.submit(engine.prepare(GenerationRequest("plain", "Say yes.", max_tokens=8), plain))
    assert slow.wait(60) and plain.wait(60)
    (failed,) = slow.of(Failed)
    assert failed.error.status == 400 and failed.error.code == "grammar_too_complex"
    assert failed.error.param == "grammar" and "ms" in failed.error.message
    assert plain.of(Finished) and engine.healthy()
    run_until_idle(engine, wait_idle(engine))


def test_the_budget_charges_only_time_past_the_allowance():
    chain = llama_mod.SamplerChain.__new__(llama_mod.SamplerChain)
    chain.grammar_excess_s = 0.0
    for _ in range(100):
        chain._charge(llama_mod.GRAMMAR_ALLOWANCE_S * 0.9)  # within the allowance: free
    assert chain.grammar_excess_s == 0.0
    with pytest.raises(llama_mod.GrammarTooSlow):
        for _ in range(100):
            chain._charge(llama_mod.GRAMMAR_ALLOWANCE_S + 0.2)
    assert chain.grammar_excess_s > llama_mod.GRAMMAR_EXCESS_BUDGET_S
