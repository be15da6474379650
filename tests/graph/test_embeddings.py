"""/v1/embeddings through both topologies with OpenAI's own SDK, on the standard cluster's embedding model
(all-MiniLM-L6-v2): each input form, vectors that rank a paraphrase first, base64 (the SDK's default) equal
to floats, every body valid against OpenAI's spec, and the 400s for the wrong kind of model or a too-long
input."""

from __future__ import annotations

import base64
import copy

import numpy as np
import openai
import pytest

from tests.support.openapi_spec import assert_valid
from tests.support.serve_harness import EMBED_MODEL, MODEL

QUERY = "A man is eating food."
PARAPHRASE = "A man is eating a piece of bread."
UNRELATED = "The new movie is awful and the cinema was cold."


def raw_embeddings(http, **body) -> dict:
    """The body, checked against OpenAI's CreateEmbeddingResponse. The spec writes `embedding` as numbers
    only, so a base64 body is checked with its strings decoded (and each must be a string)."""
    r = http.post("/v1/embeddings", json={"model": EMBED_MODEL, **body})
    assert r.status_code == 200, r.text
    checked = copy.deepcopy(r.json())
    if body.get("encoding_format") == "base64":
        for item in checked["data"]:
            assert isinstance(item["embedding"], str)
            item["embedding"] = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4").tolist()
    assert_valid("CreateEmbeddingResponse", checked)
    return r.json()


def test_each_input_form_through_the_sdk(client, http):
    one = client.embeddings.create(model=EMBED_MODEL, input=QUERY)
    assert len(one.data) == 1 and len(one.data[0].embedding) == 384
    assert one.usage.prompt_tokens == one.usage.total_tokens > 2
    texts = client.embeddings.create(model=EMBED_MODEL, input=[QUERY, PARAPHRASE, UNRELATED])
    assert [d.index for d in texts.data] == [0, 1, 2]
    ids = http.post("/tokenize", json={"model": EMBED_MODEL, "prompt": PARAPHRASE}).json()["tokens"]
    by_ids = client.embeddings.create(model=EMBED_MODEL, input=ids)
    by_id_lists = client.embeddings.create(model=EMBED_MODEL, input=[ids, ids[:4]])
    assert by_ids.usage.prompt_tokens == len(ids) and by_id_lists.usage.prompt_tokens == len(ids) + 4
    v = np.array([d.embedding for d in texts.data])
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    assert np.allclose(by_ids.data[0].embedding, v[1], atol=1e-4)
    assert np.allclose(by_id_lists.data[0].embedding, v[1], atol=1e-4)
    assert v[0] @ v[1] > 0.7 and v[0] @ v[2] < 0.3  # the paraphrase ranks far above the unrelated sentence
    assert np.allclose(one.data[0].embedding, v[0], atol=1e-4)


def test_bodies_in_float_and_base64_agree_and_follow_the_spec(http):
    floats = raw_embeddings(http, input=[QUERY, UNRELATED], encoding_format="float")
    encoded = raw_embeddings(http, input=[QUERY, UNRELATED], encoding_format="base64")
    assert floats["usage"] == encoded["usage"] and floats["model"] == EMBED_MODEL
    for f, e in zip(floats["data"], encoded["data"]):
        decoded = np.frombuffer(base64.b64decode(e["embedding"]), dtype="<f4")
        assert np.allclose(decoded, f["embedding"], atol=1e-6)
    short = raw_embeddings(http, input=QUERY, dimensions=128)["data"][0]["embedding"]
    assert len(short) == 128 and abs(np.linalg.norm(short) - 1) < 1e-4


def bad_request(call) -> dict:
    with pytest.raises(openai.BadRequestError) as err:
        call()
    body = err.value.response.json()
    assert_valid("ErrorResponse", body)
    return body["error"]


def test_wrong_kind_of_model_and_bad_inputs_are_400s(client):
    error = bad_request(lambda: client.chat.completions.create(
        model=EMBED_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4))
    assert error["param"] == "model" and "embedding model" in error["message"]
    error = bad_request(lambda: client.completions.create(model=EMBED_MODEL, prompt="hi", max_tokens=4))
    assert error["param"] == "model"
    error = bad_request(lambda: client.embeddings.create(model=MODEL, input="hi"))
    assert error["param"] == "model" and "chat model" in error["message"]
    error = bad_request(lambda: client.embeddings.create(model=EMBED_MODEL, input=["short", "word " * 600]))
    assert error["param"] == "input[1]" and error["code"] == "context_length_exceeded"
    error = bad_request(lambda: client.embeddings.create(model=EMBED_MODEL, input=["a", ""]))
    assert error["param"] == "input[1]"
    error = bad_request(lambda: client.embeddings.create(model=EMBED_MODEL, input="a", dimensions=100))
    assert error["param"] == "dimensions"
    truncated = client.embeddings.create(model=EMBED_MODEL, input="word " * 600,
                                         extra_body={"truncate_prompt_tokens": -1})
    assert truncated.usage.prompt_tokens == 512
