"""The reranker on the embedding engine (the fitted MiniLM test reranker, tests/conftest.py): pairs formatted as
llama-server formats them (the vocabulary's rule, and a `rerank` template), scores batched with other requests'
equal the single-pair scores, a held-out answer outscores its distractors, and the checks on pairs."""

from __future__ import annotations

import threading

import pytest

from app.engine.embedder import EmbeddingEngine
from app.engine.params import RerankJob
from app.engine.rerank_format import TOKEN_NULL, Pair, PairVocab, format_pair
from tests.support.engine_errors import client_error

# Held-out pairs the tool measured with a wide margin (tools/minilm_reranker_gguf.py's docstring).
QUERY = "What is the capital of Spain?"
ANSWER = "Madrid is the capital of Spain."
DISTRACTORS = ("Ottawa is the capital of Canada.", "The meeting was moved to Thursday afternoon.",
               "Frogs eat insects such as flies and mosquitoes.")


def fake_tokenize(text: str, parse_special: bool) -> list[int]:
    """Words as ids (100 + length), a template's [X] as control token 1 when parsed."""
    return [1 if parse_special and w == "[X]" else 100 + len(w) for w in text.split()]


def test_the_vocabulary_rule_places_bos_eos_and_sep_as_llama_server_does():
    bert = PairVocab(bos=101, eos=102, sep=102, add_bos=True, add_eos=True, add_sep=False)
    assert format_pair(bert, fake_tokenize, "a bb", "ccc").tokens == [101, 101, 102, 102, 103, 102]
    roberta = PairVocab(bos=0, eos=2, sep=2, add_bos=True, add_eos=True, add_sep=True)
    assert format_pair(roberta, fake_tokenize, "a", "b").tokens == [0, 101, 2, 2, 101, 2]
    no_eos = PairVocab(bos=5, eos=TOKEN_NULL, sep=7, add_bos=False, add_eos=True, add_sep=False)
    assert format_pair(no_eos, fake_tokenize, "a", "b").tokens == [101, 7, 101, 7]


def test_a_rerank_template_parses_its_own_special_tokens_but_not_the_clients():
    vocab = PairVocab(bos=101, eos=102, sep=102, add_bos=True, add_eos=True, add_sep=True,
                      template="[X] q: {query} [X] d: {document} [X]")
    pair = format_pair(vocab, fake_tokenize, "[X] a", "bb ccc")
    assert pair.tokens == [1, 102, 103, 101, 1, 102, 102, 103, 1]  # the client's "[X]" is text (103)
    assert pair.tokens[pair.start:pair.end] == [102, 103]


def test_truncation_cuts_the_end_of_the_document_only():
    pair = Pair([9, 1, 8, 2, 3, 4, 8], start=3, end=6)
    assert pair.truncated(5) == Pair([9, 1, 8, 2, 8], 3, 4)
    assert pair.truncated(3) is None  # the query alone does not fit
    assert pair.truncated(7) is pair


def rerank(engine: EmbeddingEngine, query: str, *documents: str, **kw):
    return engine.embed_now(RerankJob(request_id="t", query=query, documents=documents, **kw), timeout_s=120)


@pytest.fixture(scope="module")
def reranker(reranker_spec):
    eng = EmbeddingEngine(reranker_spec).start()
    yield eng
    eng.close()


def test_the_reranker_formats_a_bert_pair_as_cls_query_sep_document_sep(reranker):
    tokens = reranker.prepare(RerankJob(request_id="t", query="hello", documents=("world [SEP]",)))[0]
    tok = lambda t: reranker.llama.tokenize(t, add_special=False, parse_special=False)  # noqa: E731
    cls, sep = reranker.llama.bos, reranker.pair_vocab.sep
    assert tokens == [cls, *tok("hello"), sep, *tok("world [SEP]"), sep]
    assert tokens.count(sep) == 2  # the document's "[SEP]" stays text


def test_scores_batched_with_other_requests_equal_single_pair_scores(reranker):
    alone = [rerank(reranker, QUERY, d).scores[0] for d in (ANSWER, *DISTRACTORS)]
    results, steps = {}, reranker.steps
    jobs = {"rerank": RerankJob(request_id="r", query=QUERY, documents=(ANSWER, *DISTRACTORS)),
            "other": RerankJob(request_id="o", query="What do frogs eat?", documents=DISTRACTORS)}
    threads = [threading.Thread(target=lambda k=k, j=j: results.__setitem__(k, reranker.embed_now(j, 120)))
               for k, j in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert reranker.steps - steps <= 2  # seven pairs of two requests in at most two decodes
    # F16 matrices in a batch of another shape sum in another order: equal to a few thousandths of a score.
    assert results["rerank"].scores == pytest.approx(alone, abs=1e-2)
    assert results["rerank"].scores[0] > max(results["rerank"].scores[1:])  # the held-out answer wins
    assert results["rerank"].prompt_tokens == sum(len(t) for t in reranker.prepare(jobs["rerank"]))


def test_a_pair_past_the_context_is_refused_naming_the_document_or_cut_when_asked(reranker):
    long = "word " * (reranker.n_ctx + 10)
    with client_error() as err:
        rerank(reranker, QUERY, ANSWER, long)
    assert err.value.status == 400 and err.value.param == "documents[1]"
    assert err.value.code == "context_length_exceeded"
    cut = rerank(reranker, QUERY, ANSWER, long, truncate=-1)
    assert cut.prompt_tokens <= 2 * reranker.n_ctx
    with client_error() as err:
        rerank(reranker, QUERY, ANSWER, ANSWER, max_total_tokens=20)
    assert err.value.param == "documents" and err.value.code == "too_many_tokens"


def test_an_embedding_job_is_not_a_rerank_job(embedder):
    with client_error() as err:
        embedder.prepare(RerankJob(request_id="t", query="q", documents=("d",)))
    assert err.value.code == "unsupported_model"
