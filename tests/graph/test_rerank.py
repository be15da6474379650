"""/v1/rerank (and /rerank, /v2/rerank) through both topologies on the standard cluster's reranker (the fitted
MiniLM stand-in, tools/minilm_reranker_gguf.py): held-out answers ranked above their distractors, top_n and
return_documents, and the 400s for the wrong kind of model, an empty list and a too-long document."""

from __future__ import annotations

import pytest

from tests.support.serve_harness import EMBED_MODEL, MODEL, RERANK_MODEL

# Held-out (question, answer) pairs the tool measured winning by a wide margin; distractors from the same set.
CASES = (("What is the capital of Spain?", "Madrid is the capital of Spain."),
         ("What is the color of grass?", "Grass is green."))
DISTRACTORS = ["Ottawa is the capital of Canada.", "The meeting was moved to Thursday afternoon.",
               "Frogs eat insects such as flies and mosquitoes."]


def rerank(http, path: str = "/v1/rerank", **body):
    return http.post(path, json={"model": RERANK_MODEL, **body})


@pytest.mark.parametrize("query,answer", CASES)
def test_the_answer_ranks_first(http, query, answer):
    r = rerank(http, query=query, documents=[*DISTRACTORS[:2], answer, DISTRACTORS[2]])
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == RERANK_MODEL and body["results"][0]["index"] == 2
    scores = [x["relevance_score"] for x in body["results"]]
    assert scores == sorted(scores, reverse=True) and len(scores) == 4
    assert sorted(x["index"] for x in body["results"]) == [0, 1, 2, 3]
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 4 * 4


def test_aliases_top_n_and_cohere_documents(http):
    query, answer = CASES[0]
    full = rerank(http, query=query, documents=[DISTRACTORS[0], answer]).json()
    for path in ("/rerank", "/v2/rerank"):
        r = rerank(http, path, query=query, documents=[{"text": DISTRACTORS[0]}, {"text": answer}], top_n=1,
                   return_documents=True)
        assert r.status_code == 200, r.text
        (best,) = r.json()["results"]
        assert best["index"] == 1 and best["document"] == {"text": answer}
        assert best["relevance_score"] == pytest.approx(full["results"][0]["relevance_score"], abs=1e-2)


def test_the_400s(http):
    for model in (MODEL, EMBED_MODEL):
        r = http.post("/v1/rerank", json={"model": model, "query": "q", "documents": ["d"]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_model", r.text
    r = http.post("/v1/embeddings", json={"model": RERANK_MODEL, "input": "q"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_model", r.text
    r = http.post("/v1/chat/completions", json={"model": RERANK_MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_model", r.text
    r = rerank(http, query="q", documents=[])
    assert r.status_code == 400 and r.json()["error"]["param"] == "documents"
    r = rerank(http, query="q", documents=["fine", "word " * 600])
    assert r.status_code == 400 and r.json()["error"]["param"] == "documents[1]", r.text
    assert r.json()["error"]["code"] == "context_length_exceeded"
