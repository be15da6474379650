"""Prompt-lookup speculative decoding in the batched engine, on the bundled model: the output is the model's
own (greedy: the same tokens up to numerics; sampling: the same distribution), every per-token rule holds
with drafts in flight (stop strings, max_tokens, grammar, logprobs), and a request can turn it off.

One engine with speculation on; its baseline is the same engine with `speculative: false` per request, so
both decode on the same context, and no prompt reuses a cached prefix (cache_prompt false): the only
difference between the arms is the verification batch.

Numerics: verifying several tokens in one batch changes llama.cpp's sums in the last bits, so a greedy reply
may part ways where the model's top two tokens nearly tie. TIE_NATS is the largest top-2 gap (log-probs,
the baseline's) allowed at a first difference; llama.cpp's batch-shape rounding moves this 4-bit model's
logprobs by up to about 0.06 (tests/support/events.py), so a gap under 0.25 is a near-tie, a real bug (a
wrong row, a lost KV position) parts ways at confident tokens.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest

from app.config.spec import SpeculativeSpec
from app.engine import GenerationRequest, LlamaEngine, SamplingParams
from app.engine.events import Finished, Text
from app.engine.prompt_lookup import NgramDrafter, NgramIndex
from app.engine.speculation import (PROBE_MAX_STEPS, PROBE_STEPS, PROBE_TOKENS, DraftBudget,
                                    StepCost)
from app.grammar.request_grammars import json_grammar
from app.prompt.chat_template import render_prompt
from tests.support.events import EventBox
from tests.support.ties import parted_at_a_tie

pytestmark = pytest.mark.model

SLOTS = 8

COPY = [
    "Repeat this list exactly: apples, bananas, cherries, dates, elderberries, figs, grapes, honeydew, kiwis, lemons.",
    "Copy this code exactly:\ndef add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n",
    "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog near the old stone bridge.",
    "Copy this list exactly:\n1. Monday\n2. Tuesday\n3. Wednesday\n4. Thursday\n5. Friday\n6. Saturday\n7. Sunday",
    "Repeat exactly: red, orange, yellow, green, blue, indigo, violet, red, orange, yellow, green, blue.",
    "Copy this JSON exactly: {\"name\": \"Ada\", \"age\": 36, \"city\": \"London\", \"languages\": [\"en\", \"fr\"]}",
]
FREE = ["Write a short poem about the sea.", "Describe a forest in the morning."]


@pytest.fixture(scope="module")
def spec_engine(bundled_spec):
    # Every proposal verified (adaptive off): on this CPU an adaptive draft verifies little, and these tests
    # are about what verification keeps unchanged. test_adaptive_drafting covers the adaptive choice.
    spec = dataclasses.replace(bundled_spec, n_seq_max=SLOTS,
                               speculative=SpeculativeSpec(n_max=8, max_sequences=SLOTS, adaptive=False))
    eng = LlamaEngine(spec).start()
    yield eng
    eng.close()


def chat(spec, text: str) -> str:
    return render_prompt(spec.chat_template, [{"role": "user", "content": text}])


def submit(eng, prompt: str, *, speculative: bool = True, max_tokens: int = 64, logprobs: int | None = 2,
           stop: list[str] | None = None, rid: str = "r", **sampling) -> EventBox:
    box = EventBox()
    req = GenerationRequest(request_id=rid, prompt=prompt, max_tokens=max_tokens, stop=stop or [],
                            sampling=SamplingParams(**(sampling or {"temperature": 0})), logprobs=logprobs,
                            cache_prompt=False, speculative=speculative)
    eng.submit(eng.prepare(req, box))
    return box


def run(eng, prompts: list[str], **kw) -> list[EventBox]:
    boxes = [submit(eng, p, rid=f"r{i}", **kw) for i, p in enumerate(prompts)]
    for box in boxes:
        assert box.wait(600), box.events
    return boxes


def accepted(eng) -> int:
    return eng.stats()["spec_decode"]["num_accepted_tokens"]


def finished(box: EventBox) -> Finished:
    assert isinstance(box.last, Finished), box.events
    return box.last


def copy_prompts(eng) -> list[str]:
    return [chat(eng.spec, t) for t in COPY]


def test_the_model_copies_so_drafts_are_accepted(spec_engine):
    """The corpus is one the model really copies: most draft tokens are accepted."""
    before = spec_engine.stats()["spec_decode"]
    boxes = run(spec_engine, copy_prompts(spec_engine)[:2])
    after = spec_engine.stats()["spec_decode"]
    assert "apples, bananas, cherries, dates" in boxes[0].text and "return a * b" in boxes[1].text
    drafted = after["num_draft_tokens"] - before["num_draft_tokens"]
    taken = after["num_accepted_tokens"] - before["num_accepted_tokens"]
    assert after["num_drafts"] > before["num_drafts"] and taken > drafted / 3, (before, after)


# Sixteen replies of each arm twice (~25 s): make test-slow. make test asks the same of the graph at four streams
# (tests/graph/test_speculative_graph.py, both topologies).
@pytest.mark.slow
@pytest.mark.parametrize("concurrency", [1, SLOTS])
def test_greedy_replies_equal_without_speculation(spec_engine, concurrency):
    prompts = copy_prompts(spec_engine) + [chat(spec_engine.spec, t) for t in FREE]
    prompts = prompts[:SLOTS]

    def arm(speculative: bool) -> list[EventBox]:
        if concurrency == 1:
            return [run(spec_engine, [p], speculative=speculative)[0] for p in prompts]
        return run(spec_engine, prompts, speculative=speculative)

    base = arm(False)
    taken = accepted(spec_engine)
    spec = arm(True)
    assert accepted(spec_engine) > taken
    # The guarantee: where a reply parts from its twin without drafts, the model's top two tokens there were within
    # TIE_NATS (asserted in parted_at_a_tie). How many part is not guaranteed: a batch of another shape may order a
    # near-tie differently, and 3 or 4 of 8 replies parted so in make run's shape on some runs.
    for a, b in zip(base, spec):
        parted_at_a_tie(a, b)


def test_stop_string_inside_a_draft(spec_engine):
    prompt = copy_prompts(spec_engine)[0]
    base, spec = (run(spec_engine, [prompt], speculative=s, stop=["grapes"])[0] for s in (False, True))
    assert finished(spec).finish_reason == "stop" and "grapes" not in spec.text and "figs" in spec.text
    assert spec.text == base.text
    # The slot's KV was cut back to what it holds: the same prompt again, reusing its prefix, says the same.
    again = submit(spec_engine, prompt, stop=["grapes"])
    assert again.wait(600) and again.text == spec.text


@pytest.mark.parametrize("max_tokens", [3, 5, 9, 14])
def test_max_tokens_landing_inside_a_draft(spec_engine, max_tokens):
    prompt = copy_prompts(spec_engine)[1]
    full = run(spec_engine, [prompt], speculative=False, max_tokens=20)[0]
    spec = run(spec_engine, [prompt], max_tokens=max_tokens)[0]
    fin = finished(spec)
    assert (fin.finish_reason, fin.completion_tokens) == ("length", max_tokens)
    assert [lp.token for lp in spec.logprobs] == [lp.token for lp in full.logprobs][:max_tokens]


def test_logprobs_one_per_token(spec_engine):
    box = run(spec_engine, [copy_prompts(spec_engine)[3]], logprobs=3, max_tokens=48)[0]
    fin = finished(box)
    tokens = sum(e.tokens for e in box.events if isinstance(e, Text))
    eog = fin.finish_reason == "stop" and fin.stop_sequence is None  # counted, never shown
    assert len(box.logprobs) == tokens == fin.completion_tokens - eog
    assert all(len(lp.top) == 3 and lp.logprob <= 0 for lp in box.logprobs)


@pytest.mark.parametrize("logprobs", [None, 1])
def test_grammar_with_speculation(spec_engine, logprobs):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                               "city": {"type": "string"}}, "required": ["name", "age", "city"]}
    grammar = json_grammar(schema, "response_format")
    prompt = copy_prompts(spec_engine)[5]
    taken = accepted(spec_engine)
    base, spec = (run(spec_engine, [prompt], speculative=s, max_tokens=60, logprobs=logprobs, temperature=0,
                      grammar=grammar)[0] for s in (False, True))
    assert accepted(spec_engine) > taken
    doc = json.loads(spec.text)
    assert set(doc) >= {"name", "age", "city"} and spec.text == base.text


def test_request_turns_it_off(spec_engine):
    before = spec_engine.stats()["spec_decode"]
    run(spec_engine, copy_prompts(spec_engine)[:1], speculative=False)
    assert spec_engine.stats()["spec_decode"] == before


# A prompt whose end repeats an earlier n-gram: the first sampled token's successor is drafted at once.
LOOP_PROMPT = "one two three four five one two three four five one two three four five one two"


# A statistical test over hundreds of sampled replies (~25 s here): make test-slow.
@pytest.mark.slow
def test_sampling_keeps_the_distribution(spec_engine):
    """The first three tokens sampled at temperature 0.7 (the third is the first a draft can decide: the first
    comes from the prompt, the second's row verifies a one-token draft).
    - Seeded: a request's RNG draws once per emitted token with or without drafts, so the same seed gives the
      same reply (up to numerics moving a draw across a boundary: at least 95% equal).
    - Unseeded against each other (different seeds): the third token's distribution with and without drafts,
      a chi-square test of homogeneity at p = 0.001 (critical values below)."""
    samples = 96

    def replies(speculative: bool, seed0: int) -> list[tuple[bytes, ...]]:
        out = []
        for wave in range(0, samples, SLOTS):
            boxes = [submit(spec_engine, LOOP_PROMPT, rid=f"s{i}", speculative=speculative, max_tokens=3,
                            logprobs=0, temperature=0.7, top_k=0, top_p=1.0, min_p=0.0, seed=seed0 + wave + i)
                     for i in range(SLOTS)]
            for box in boxes:
                assert box.wait(600), box.events
                out.append(tuple(lp.token for lp in box.logprobs))
        return out

    taken = accepted(spec_engine)
    off, on, on_other = replies(False, 1), replies(True, 1), replies(True, 100_000)
    assert accepted(spec_engine) - taken > samples // 4  # drafts decided many third tokens
    same = sum(a == b for a, b in zip(off, on))
    assert same >= 0.95 * samples, (same, off, on)

    def third(rs: list[tuple[bytes, ...]]) -> Counter:
        return Counter(r[2] if len(r) >= 3 else b"<end>" for r in rs)

    chi2, dof = chi_square(third(off), third(on_other))
    assert chi2 < CHI2_CRITICAL_0001[min(dof, max(CHI2_CRITICAL_0001))], (chi2, dof, third(off), third(on_other))


# The chi-square distribution's 0.999 quantiles by degrees of freedom (larger dof: the table's last).
CHI2_CRITICAL_0001 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12}


def chi_square(a: Counter, b: Counter) -> tuple[float, int]:
    """Homogeneity of two samples' categories, rare ones (expected under 5 in either) pooled."""
    na, nb = sum(a.values()), sum(b.values())
    cats = sorted(set(a) | set(b), key=lambda c: -(a[c] + b[c]))
    cells: list[tuple[int, int]] = []
    rare = [0, 0]
    for c in cats:
        total = a[c] + b[c]
        if min(total * na, total * nb) / (na + nb) >= 5:
            cells.append((a[c], b[c]))
        else:
            rare[0] += a[c]
            rare[1] += b[c]
    if sum(rare):
        cells.append((rare[0], rare[1]))
    chi2 = 0.0
    for x, y in cells:
        total = x + y
        for obs, n in ((x, na), (y, nb)):
            exp = total * n / (na + nb)
            chi2 += (obs - exp) ** 2 / exp
    return chi2, max(1, len(cells) - 1)


def test_adaptive_drafting_pays_for_rows_only_where_they_gain(bundled_spec):
    """Adaptive (the default): the engine times its own steps by rows at start; with a CPU's cost free writing
    verifies few drafts, with free rows (a GPU's) a copying reply verifies most of its proposals; greedy
    replies stay the model's own either way."""
    spec = dataclasses.replace(bundled_spec, n_seq_max=2, speculative=SpeculativeSpec(n_max=8))
    eng = LlamaEngine(spec).start()
    try:
        measured = eng.stats()["spec_step_ms"]
        assert measured[1] > 0 and max(measured) >= 16, measured
        eng.speculation.step_cost = CPU  # this machine's figures, whatever the machine running the test
        prompts = [chat(eng.spec, t) for t in FREE]
        base = run(eng, prompts, speculative=False, max_tokens=48)
        spec_boxes = run(eng, prompts, max_tokens=48)
        generated = sum(finished(b).completion_tokens for b in spec_boxes)
        drafted = eng.stats()["spec_decode"]["num_draft_tokens"]
        assert drafted <= generated / 4, (drafted, generated)
        for a, b in zip(base, spec_boxes):
            parted_at_a_tie(a, b)
        eng.speculation.step_cost = StepCost.flat()
        copies = run(eng, copy_prompts(eng)[:2], max_tokens=48)
        after = eng.stats()["spec_decode"]
        assert "apples, bananas, cherries" in copies[0].text
        assert after["num_draft_tokens"] - drafted >= 24, after  # most of a copying reply drafted
    finally:
        eng.close()


# -- the drafting side, without a model ------------------------------------------------------------------

def test_ngram_drafter_proposes_what_followed_the_latest_match():
    d = NgramDrafter(ngram_max=3, ngram_min=2)
    assert d.propose([1, 2, 3, 4, 5, 9, 2, 3], 2) == [4, 5]
    assert d.propose([1, 2, 3, 7, 1, 2, 3, 8, 1, 2, 3], 3) == [8, 1, 2]  # the latest earlier occurrence
    assert d.propose([1, 2, 3, 4], 4) == []  # no earlier n-gram
    assert d.propose([5, 2, 3, 6, 9, 3], 4) == []  # a lone token is below ngram_min
    assert NgramDrafter(ngram_min=1).propose([5, 2, 3, 6, 9, 3], 1) == [6]
    assert d.propose([1, 2, 1, 2], 0) == []


def test_ngram_index_follows_a_growing_sequence_like_a_fresh_lookup():
    """The incremental index answers as a lookup over the whole sequence does, step by step, window or not."""
    import random
    rng = random.Random(7)
    tokens = [rng.randrange(6) for _ in range(400)]
    d = NgramDrafter(ngram_max=3, ngram_min=2)
    grown, windowed = d.sequence(), NgramIndex(3, 2, window=64)
    for end in range(1, len(tokens)):
        want = d.propose(tokens[:end + 1], 5)
        assert grown.propose(tokens[:end], tokens[end], 5) == want, end
        got = windowed.propose(tokens[:end], tokens[end], 5)
        # The window (64 to 128 tokens) only forgets what lies before it.
        assert got == d.propose(tokens[windowed._start:end + 1], 5), end
        assert end - windowed._start <= 128


# A CPU's step by rows (seconds; this machine's, for the bundled model): a row costs most of a token. A GPU's is flat.
CPU = StepCost({n: ms / 1e3 for n, ms in {1: 6.4, 2: 12.9, 4: 20.8, 8: 35.9, 16: 67.7, 32: 131.5}.items()})


def test_adaptive_budget_verifies_only_what_gains():
    b = DraftBudget(n_max=8)
    assert b.length(8, StepCost.flat(), rows=1, sequences=1) == 8  # free rows: every draft (prior 1/2)
    assert b.length(8, CPU, rows=1, sequences=1) == 0             # a CPU at an acceptance of 1/2: none
    for _ in range(60):
        b.verified(8, 8)  # a sequence that copies exactly
    assert b.acceptance > 0.97 and b.length(8, CPU, rows=1, sequences=1) == 8
    for _ in range(10):
        b.verified(8, 0)  # it stopped copying
    assert b.length(8, CPU, rows=1, sequences=1) == 0 and b.length(8, StepCost.flat(), 1, 1) == 8
    assert (b.drafted, b.accepted) == (560, 480)
    assert b.length(8, StepCost.flat(), rows=1, sequences=1) <= 8 and b.length(2, StepCost.flat(), 1, 1) == 2
    assert DraftBudget(n_max=8, n_min=3).length(2, StepCost.flat(), 1, 1) == 0  # under n_min
    assert DraftBudget(n_max=4, adaptive=False).length(8, CPU, 1, 1) == 4        # not adaptive: every proposal


def test_a_watched_proposal_measures_acceptance_without_verifying():
    b = DraftBudget(n_max=8)
    start = b.acceptance
    for _ in range(20):
        b.watch([5, 6, 7])
        for token in (5, 6, 7):
            b.generated(token)
    assert b.acceptance > 0.9 > start and b.drafted == 0
    for _ in range(20):
        b.watch([5, 6, 7])
        b.generated(9)  # a miss ends the watch: the next tokens are not compared
        b.generated(6)
    assert b.acceptance < 0.4 and b.length(3, CPU, rows=1, sequences=1) == 0


def test_a_costly_drafter_is_probed_ever_less_and_never_where_it_cannot_pay():
    """A draft model's proposal costs its decodes: asked where drafts pay; where they would pay only at a better
    acceptance, probed with a short proposal after PROBE_STEPS steps, then ever more rarely; never where even an
    acceptance of 1 would not pay (here: a draft costing 5 ms a token beside a CPU's 6.4 ms step)."""
    cheap_draft, slow_draft = 0.0002, 0.005
    good = DraftBudget(n_max=8)
    for _ in range(60):
        good.verified(8, 8)
    assert good.tokens_to_ask(8, CPU, 1, 1, cheap_draft) == 8
    assert all(good.tokens_to_ask(8, CPU, 1, 1, slow_draft) == 0 for _ in range(5000))
    poor = DraftBudget(n_max=8)
    for _ in range(60):
        poor.verified(8, 0)
    asked = [step for step in range(4000) if poor.tokens_to_ask(8, CPU, 1, 1, cheap_draft)]
    gaps = [b - a for a, b in zip([-1, *asked], asked)]
    assert gaps[:4] == [PROBE_STEPS, 2 * PROBE_STEPS, 4 * PROBE_STEPS, 8 * PROBE_STEPS], gaps
    assert max(gaps) == PROBE_MAX_STEPS and len(asked) < 20
    assert poor.tokens_to_ask(8, CPU, 1, 1, cheap_draft) in (0, PROBE_TOKENS)


def test_step_cost_interpolates_and_extrapolates():
    assert CPU.seconds(1) == 0.0064 and CPU.seconds(3) == pytest.approx(0.01685)
    assert CPU.seconds(64) == pytest.approx((131.5 + 32 * (131.5 - 67.7) / 16) / 1e3)
    assert StepCost({1: 2.0}).seconds(4) == 8.0
    calls = []
    cost = StepCost.measure(calls.append, [1, 4], repeats=2)
    assert calls == [1, 1, 1, 4, 4] and set(cost.as_dict()) == {1, 4}
