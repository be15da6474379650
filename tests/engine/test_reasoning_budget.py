"""Reasoning budgets in the engine (app/engine/reasoning_budget.py), on the bundled model.

The 135M model does not think by itself, so the prompt opens the reasoning as a thinking model's template does
(`...<|im_start|>assistant\\n<think>\\n`, DeepSeek-R1's and Qwen3-Thinking's way) and its ends of generation are
biased away (-100): whatever it writes is reasoning, and it never stops on its own, so only the budget can close
the reasoning. What this proves: the engine counts the model's reasoning tokens, takes the closing tokens (the
message, then `</think>`) exactly at the budget as the model's own tokens (in the KV: the answer after them is
generated from them), reports `reasoning_tokens` exactly, defers a grammar to the answer, and keeps all of it
with drafts in flight. It does not prove that a real reasoning model answers better for it.
"""

from __future__ import annotations

import dataclasses

import pytest

from app.config.spec import SpeculativeSpec
from app.engine import GenerationRequest, LlamaEngine, SamplingParams
from app.engine.events import Finished
from app.engine.params import ReasoningLimit
from app.engine.reasoning_budget import ReasoningTracker
from app.prompt.chat_template import render_prompt
from tests.support.events import EventBox

MESSAGE = "\n\nTime is up; answering now.\n"
NO_END = [(0, -100.0), (2, -100.0)]  # <|endoftext|>, <|im_end|>: the model never ends a reply by itself


def limit(budget: int | None, starts_open: bool = True) -> ReasoningLimit:
    return ReasoningLimit(budget=budget, starts_open=starts_open, message=MESSAGE)


# ---- the tracker alone -----------------------------------------------------------------------------------------

def test_the_tracker_counts_and_closes_at_the_budget():
    t = ReasoningTracker(limit(3), close_tokens=[7, 8, 9], marker_tokens=[9])
    assert not t.due()
    for text in ("a", "b", "c"):
        t.took(text)
    assert t.due() and t.tokens == 3 and t.spent == 3
    assert t.closing_tokens() == [7, 8, 9]  # the message, then the marker
    assert not t.due()  # under way
    t.took(MESSAGE)
    assert t.inside and t.spent == 3  # the forced message does not spend the budget
    assert t.took("</think>") and not t.inside
    assert t.tokens == 5
    t.took("answer")
    assert t.tokens == 5  # the answer is no reasoning


def test_a_budget_of_zero_closes_with_the_marker_alone_and_reopened_reasoning_closes_at_once():
    t = ReasoningTracker(limit(0), close_tokens=[7, 8, 9], marker_tokens=[9])
    assert t.due() and t.closing_tokens() == [9]
    assert t.took("</think>")
    t2 = ReasoningTracker(limit(1), close_tokens=[7, 8, 9], marker_tokens=[9])
    t2.took("x")
    assert t2.closing_tokens() == [7, 8, 9]
    t2.took("</think>")
    t2.took("<think>")  # the model opens its reasoning again: the budget is spent, the marker alone closes it
    assert t2.due() and t2.closing_tokens() == [9]


def test_markers_cut_across_tokens_are_found_and_a_reply_may_open_its_reasoning_itself():
    t = ReasoningTracker(limit(None, starts_open=False), [1], [1])
    for piece in ("Sure. <th", "ink>", "hm", "</", "thi", "nk>", "Done"):
        t.took(piece)
    assert not t.inside and t.tokens == 5  # "Sure. <th" opened nothing yet; "Done" is the answer
    assert t.draft_room() > 10**6  # no budget: drafts unbounded by it


def test_draft_room_leaves_the_budget_to_the_last_row():
    t = ReasoningTracker(limit(10), [1], [1])
    for _ in range(4):
        t.took("x")
    assert t.draft_room() == 5  # 5 drafts + the step's own token: 10 spent at most


def test_replay_goes_on_where_an_earlier_round_left_and_says_where_the_answer_starts():
    t = ReasoningTracker(limit(4), [1], [1])
    assert t.replay(["a", "b", "</think>", "x"]) == 3 and t.spent == 2 and t.tokens == 0
    t2 = ReasoningTracker(limit(4), [1], [1])
    assert t2.replay(["a", "b"]) is None and t2.spent == 2
    assert ReasoningTracker(limit(4, starts_open=False), [1], [1]).replay(["a"]) == 0


# ---- the engine ------------------------------------------------------------------------------------------------

def thinking_prompt(spec, question: str = "How many legs does a spider have? Think step by step.") -> str:
    return render_prompt(spec.chat_template, [{"role": "user", "content": question}]) + "<think>\n"


def generate(eng, prompt: str, budget: int | None, *, max_tokens: int = 40, starts_open: bool = True,
             grammar: str | None = None, logprobs: int | None = None, speculative: bool = True,
             bias: list | None = None) -> tuple[EventBox, Finished]:
    box = EventBox()
    sampling = SamplingParams(temperature=0, logit_bias=list(NO_END if bias is None else bias), grammar=grammar)
    req = GenerationRequest(request_id="rb", prompt=prompt, max_tokens=max_tokens, sampling=sampling,
                            reasoning=limit(budget, starts_open), cache_prompt=False, return_tokens=True,
                            logprobs=logprobs, speculative=speculative)
    eng.submit(eng.prepare(req, box))
    assert box.wait(120), box.events
    return box, next(e for e in box.events if isinstance(e, Finished))


def closing(eng) -> tuple[list[int], list[int]]:
    close, marker = eng.intake.closing(MESSAGE, "</think>")
    return list(close), list(marker)


@pytest.mark.model
def test_the_budget_closes_the_reasoning_exactly_where_it_is_spent(engine, bundled_spec):
    prompt = thinking_prompt(bundled_spec)
    close, marker = closing(engine)
    _, unbounded = generate(engine, prompt, None)
    assert unbounded.reasoning_tokens == unbounded.completion_tokens == 40  # never closed: all of it reasoning
    assert not any(unbounded.token_ids[i:i + len(marker)] == tuple(marker) for i in range(40))

    box, fin = generate(engine, prompt, 16)
    ids = list(fin.token_ids)
    assert ids[:16] == list(unbounded.token_ids[:16])  # the model's own 16 tokens, unchanged
    assert ids[16:16 + len(close)] == close  # then the message and the marker, as tokens
    assert fin.reasoning_tokens == 16 + len(close)  # exact: counted where the tokens were taken
    answer = box.text.split("</think>", 1)[1]
    assert answer.strip()  # the answer follows, generated after the close in the KV
    assert fin.finish_reason == "length" and fin.completion_tokens == 40

    box0, fin0 = generate(engine, prompt, 0)
    assert list(fin0.token_ids[:len(marker)]) == marker  # no thought, no message: the marker alone
    assert box0.text.startswith("</think>") and fin0.reasoning_tokens == len(marker)


@pytest.mark.model
def test_forced_tokens_have_logprobs_and_respect_max_tokens(engine, bundled_spec):
    prompt = thinking_prompt(bundled_spec)
    close, _ = closing(engine)
    box, fin = generate(engine, prompt, 4, logprobs=1)
    assert len(box.logprobs) == fin.completion_tokens == 40
    assert [lp.token for lp in box.logprobs[4:4 + len(close)]] == [engine.llama.piece(t) for t in close]
    assert all(lp.logprob is not None and lp.logprob <= 0 for lp in box.logprobs)
    # A limit inside the close: the reply ends there, cut as any reply is, the close's tokens counted.
    box, fin = generate(engine, prompt, 4, max_tokens=7)
    assert fin.finish_reason == "length" and fin.completion_tokens == 7 == fin.reasoning_tokens
    assert list(fin.token_ids[4:]) == close[:3]


@pytest.mark.model
def test_a_grammar_applies_to_the_answer_after_the_reasoning(engine, bundled_spec):
    from app.grammar.request_grammars import client_grammar

    grammar = client_grammar('root ::= "yes" | "no"', "grammar", 64, 1000)
    box, fin = generate(engine, thinking_prompt(bundled_spec), 8, grammar=grammar, max_tokens=200)
    reasoning, answer = box.text.split("</think>", 1)
    assert answer in ("yes", "no") and fin.finish_reason == "stop"
    assert MESSAGE.strip() in reasoning and len(reasoning) > len(MESSAGE)  # 8 free tokens, then the message


@pytest.mark.model
def test_a_grammar_that_writes_the_reasoning_itself_and_refuses_the_close_ends_the_reply(engine, bundled_spec):
    """A reply that does not start inside its reasoning has its grammar from the first token: a grammar of the
    client's own may write the reasoning, and when it cannot take the close the budget ends the reply."""
    from app.grammar.request_grammars import client_grammar

    grammar = client_grammar('root ::= "<think>" [a-z ]{1,100} "</think>" [a-z ]{1,20}', "grammar", 64, 1000)
    prompt = render_prompt(bundled_spec.chat_template, [{"role": "user", "content": "Say something."}])
    box, fin = generate(engine, prompt, 4, starts_open=False, grammar=grammar, max_tokens=100, bias=[])
    assert fin.finish_reason == "length" and fin.completion_tokens < 100
    assert box.text.startswith("<think>") and "</think>" not in box.text


@pytest.fixture(scope="module")
def spec_engine(bundled_spec):
    spec = dataclasses.replace(bundled_spec, n_seq_max=2,
                               speculative=SpeculativeSpec(n_max=8, max_sequences=2, adaptive=False))
    eng = LlamaEngine(spec).start()
    yield eng
    eng.close()


@pytest.mark.model
def test_drafts_never_cross_the_budget(spec_engine, bundled_spec):
    """Prompt lookup proposes the copied list, so drafts are in flight when the budget runs out: the close still
    lands after exactly 16 of the model's tokens, and the reply is the one without speculation."""
    words = "apples, bananas, cherries, dates, elderberries, figs, grapes, honeydew, kiwis, lemons, mangoes"
    prompt = thinking_prompt(bundled_spec, f"Repeat this list exactly: {words}, {words}")
    close, _ = closing(spec_engine)
    before = spec_engine.stats()["spec_decode"]["num_accepted_tokens"]
    _, fin = generate(spec_engine, prompt, 16)
    assert spec_engine.stats()["spec_decode"]["num_accepted_tokens"] > before  # drafts were verified
    assert list(fin.token_ids[16:16 + len(close)]) == close and fin.reasoning_tokens == 16 + len(close)
    _, plain = generate(spec_engine, prompt, 16, speculative=False)
    assert plain.token_ids[:16 + len(close)] == fin.token_ids[:16 + len(close)]
