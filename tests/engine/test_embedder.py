"""The embedding engine on a real model (all-MiniLM-L6-v2, tests/conftest.py): batched vectors equal the vectors
one input at a time, inputs of several requests share one llama_decode, normalization and truncation to
`dimensions`, token-id inputs, and the checks on inputs and their limits."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from app.engine.errors import EngineError
from app.engine.embedder import EmbeddingEngine, finish_vector
from app.engine.params import EmbeddingJob
from tests.support.engine_errors import client_error

TEXTS = (
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums, loudly, in front of a large and cheering crowd.",
    "ok",
)


def job(*inputs, **kw) -> EmbeddingJob:
    return EmbeddingJob(request_id="t", inputs=tuple(inputs), **kw)


def vectors(engine: EmbeddingEngine, *inputs, **kw) -> np.ndarray:
    return np.stack(engine.embed_now(job(*inputs, **kw), timeout_s=120).vectors)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_a_batch_gives_the_vectors_of_one_input_at_a_time(embedder):
    steps = embedder.steps
    batched = vectors(embedder, *TEXTS)
    assert embedder.steps == steps + 1  # all six inputs in one llama_decode
    for text, vector in zip(TEXTS, batched):
        alone = vectors(embedder, text)[0]
        assert cosine(alone, vector) > 0.9999, text


def test_the_vectors_are_the_models(embedder):
    """all-MiniLM-L6-v2's own similarities (sentence-transformers gives 0.755 for the first pair): a paraphrase
    far above unrelated sentences."""
    v = vectors(embedder, *TEXTS[:4])
    assert v.shape == (4, 384)
    assert abs(float(v[0] @ v[1]) - 0.755) < 0.01
    assert float(v[0] @ v[2]) < 0.2 and float(v[0] @ v[3]) < 0.2


def test_requests_waiting_together_share_one_decode(embedder):
    jobs = [job(text) for text in TEXTS[:4]]
    prepared = [embedder.prepare(j) for j in jobs]
    steps = embedder.steps
    with embedder._cv:  # the decode thread takes them only once all four wait
        futures = [embedder.submit(j, t) for j, t in zip(jobs, prepared)]
    results = [f.result(120) for f in futures]
    assert embedder.steps == steps + 1
    together = np.stack([r.vectors[0] for r in results])
    assert np.allclose(together, vectors(embedder, *TEXTS[:4]), atol=1e-4)
    assert [r.prompt_tokens for r in results] == [len(t[0]) for t in prepared]


def test_vectors_are_unit_length_unless_the_entry_says_not(embedder_spec, embedder):
    normalized = vectors(embedder, *TEXTS[:3])
    assert np.allclose(np.linalg.norm(normalized, axis=1), 1.0, atol=1e-5)
    raw_engine = EmbeddingEngine(replace(embedder_spec, normalize=False)).start()
    try:
        raw = vectors(raw_engine, *TEXTS[:3])
    finally:
        raw_engine.close()
    norms = np.linalg.norm(raw, axis=1)
    assert np.all(np.abs(norms - 1.0) > 0.01)  # mean pooling alone leaves them longer or shorter
    assert np.allclose(raw / norms[:, None], normalized, atol=1e-4)


def test_dimensions_keep_the_first_components_renormalized(embedder):
    full_raw = vectors(embedder, TEXTS[0])[0]
    short = vectors(embedder, TEXTS[0], dimensions=128)[0]
    assert short.shape == (128,)
    assert np.isclose(np.linalg.norm(short), 1.0, atol=1e-5)
    assert np.allclose(short, finish_vector(full_raw, 128, True), atol=1e-5)


def test_token_ids_embed_as_the_text_they_came_from(embedder):
    ids = tuple(embedder.tokenize(TEXTS[1]))
    assert ids[0] != ids[1] and len(ids) > 5  # [CLS] ... [SEP] around the words
    by_text, by_ids = vectors(embedder, TEXTS[1], ids)
    assert cosine(by_text, by_ids) > 0.99999
    assert embedder.embed_now(job(ids)).prompt_tokens == len(ids)


def test_client_text_never_becomes_a_control_token(embedder):
    assert embedder.tokenize("[SEP]").count(embedder.llama.tokenize("[SEP]", add_special=False)[0]) == 1  # its own, at the end
    plain = embedder.tokenize("[CLS] hello [SEP]")
    assert len(plain) > 4  # the brackets and letters as words, between the model's own [CLS] and [SEP]


def test_an_input_past_the_context_is_refused_naming_it(embedder):
    long = "word " * 600
    with client_error() as err:
        embedder.prepare(job("short", long))
    assert err.value.status == 400 and err.value.param == "input[1]"
    assert err.value.code == "context_length_exceeded" and "512" in err.value.message
    with client_error() as err:
        embedder.prepare(job(long, single=True))
    assert err.value.param == "input"


def test_truncation_keeps_the_last_tokens(embedder):
    long = "word " * 600
    tokens = embedder.prepare(job(long, truncate=-1))[0]
    assert len(tokens) == 512
    assert tokens == embedder.tokenize(long)[-512:]
    assert len(embedder.prepare(job(long, truncate=100))[0]) == 100
    with client_error() as err:
        embedder.prepare(job(long, truncate=513))
    assert err.value.param == "truncate_prompt_tokens"
    result = embedder.embed_now(job(long, "short", truncate=-1))
    assert result.prompt_tokens == 512 + len(embedder.tokenize("short"))


def test_token_ids_outside_the_vocabulary_are_refused(embedder):
    with client_error() as err:
        embedder.prepare(job((101, 7592), (101, 30522, 102)))
    assert err.value.param == "input[1]" and err.value.code == "invalid_token"
    with pytest.raises(EngineError):
        embedder.prepare(job((-1,)))


def test_the_total_token_budget_is_checked(embedder):
    n = len(embedder.tokenize(TEXTS[0]))
    assert len(embedder.prepare(job(TEXTS[0], TEXTS[0], max_total_tokens=2 * n))) == 2
    with client_error() as err:
        embedder.prepare(job(TEXTS[0], TEXTS[0], TEXTS[0], max_total_tokens=2 * n))
    assert err.value.code == "too_many_tokens" and "input[2]" in err.value.message


def test_more_inputs_than_a_batch_holds_span_several_decodes(embedder_spec, embedder):
    """n_seq_max (16) inputs per decode, and never more than n_batch (512) tokens in one."""
    many = [f"sentence number {i} about something" for i in range(40)]
    steps = embedder.steps
    got = vectors(embedder, *many)
    assert embedder.steps - steps == 3
    assert cosine(got[39], vectors(embedder, many[39])[0]) > 0.9999
    long = "word " * 500  # 502 tokens: two do not fit one batch
    steps = embedder.steps
    vectors(embedder, long, long)
    assert embedder.steps - steps == 2


def test_a_request_cancelled_while_waiting_is_never_decoded(embedder):
    j = job(TEXTS[0])
    tokens = embedder.prepare(j)
    steps = embedder.steps
    with embedder._cv:
        future = embedder.submit(j, tokens)
        assert future.cancel()
    after = embedder.embed_now(job(TEXTS[1]))  # the queue moves on
    assert len(after.vectors) == 1 and embedder.steps == steps + 1
