"""LoRA adapters through the real graph, in both topologies: the shared clusters' bundled model has two
adapters written by tools/make_lora.py at session start (`a1`, `a2`: tests/support/serve_harness.py).

What holds and is asserted: an adapter changes the base model's greedy reply; scale 0 (through `lora`) is the
base model exactly (llama.cpp leaves a zero-scale adapter out of its graph, so its sequences batch with the
base's); an unknown adapter is a 404 `model_not_found` in OpenAI's and Anthropic's shapes; /v1/models lists
each adapter as `<base>:<adapter>` with its base as parent; and the base and two adapters decoding at once
each reply as when served alone. That last one is exact because the engine decodes one adapter set per
step (docs/architecture.md), so a set with one sequence decodes it in batches of the shapes it has alone,
and every request here sends REPRODUCIBLE (no reused prefix, so the prompt's batch shapes match too).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import anthropic
import pytest

from tests.support.anthropic_spec import assert_valid_error
from tests.support.openapi_spec import assert_valid
from tests.support.serve_harness import ADAPTERS, KEY_A, MODEL, REPRODUCIBLE
from tests.support.ties import same_up_to_a_tie

pytestmark = pytest.mark.timeout(600)

QUESTION = [{"role": "user", "content": "Name a fruit and say why you like it."}]


def chat(http, model: str, **extra) -> dict:
    body = {"model": model, "messages": QUESTION, "max_tokens": 16, "temperature": 0, **REPRODUCIBLE, **extra}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def text(http, model: str, **extra) -> str:
    return chat(http, model, **extra)["choices"][0]["message"]["content"]


def test_the_replicas_loaded_the_adapters_at_start(cluster):
    assert cluster.model_stats(MODEL)["adapters"] == sorted(ADAPTERS)


def test_models_lists_each_adapter_under_its_base(http):
    r = http.get("/v1/models")
    assert r.status_code == 200
    cards = {m["id"]: m for m in r.json()["data"]}
    for name in ADAPTERS:
        card = cards[f"{MODEL}:{name}"]
        assert card["parent"] == MODEL and card["root"] == MODEL, card
        assert_valid("Model", card)
    assert "parent" not in cards[MODEL]
    r = http.get(f"/v1/models/{MODEL}:a1")
    assert r.status_code == 200 and r.json()["parent"] == MODEL
    r = http.get("/health")
    assert r.status_code == 200 and f"{MODEL}:a1" not in r.json()["models"]  # health is per model


def test_an_adapter_changes_the_greedy_reply_and_scale_zero_is_the_base(http):
    base = text(http, MODEL)
    adapted = chat(http, f"{MODEL}:a1")
    assert adapted["model"] == f"{MODEL}:a1"  # the reply names what was asked for
    assert adapted["choices"][0]["message"]["content"] != base
    assert text(http, f"{MODEL}:a2") not in (base, adapted["choices"][0]["message"]["content"])
    # llama-server's per-request list: a1 at scale 0 is the base model exactly, by name or by index.
    assert text(http, f"{MODEL}:a1", lora=[{"name": "a1", "scale": 0}]) == base
    assert text(http, MODEL, lora=[{"id": 0, "scale": 0.0}]) == base
    # and a1 named by index at its configured scale is `model: <base>:a1`
    assert text(http, MODEL, lora=[{"id": 0, "scale": 1.0}]) == adapted["choices"][0]["message"]["content"]


def test_legacy_completions_take_an_adapter(http):
    def complete(model: str, **extra) -> str:
        r = http.post("/v1/completions", json={"model": model, "prompt": "The capital of France is",
                                               "max_tokens": 12, "temperature": 0, **REPRODUCIBLE, **extra})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == model
        return r.json()["choices"][0]["text"]

    base = complete(MODEL)
    assert complete(f"{MODEL}:a1") != base
    assert complete(f"{MODEL}:a1", lora=[{"name": "a1", "scale": 0}]) == base


def test_responses_and_messages_take_an_adapter(http, cluster):
    r = http.post("/v1/responses", json={"model": f"{MODEL}:a2", "input": "Name a fruit.", "max_output_tokens": 8,
                                         "store": False})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == f"{MODEL}:a2" and r.json()["status"] in ("completed", "incomplete")
    sdk = anthropic.Anthropic(base_url=cluster.url, api_key=KEY_A, max_retries=0, timeout=120)
    message = sdk.messages.create(model=f"{MODEL}:a1", max_tokens=8, messages=QUESTION)
    assert message.model == f"{MODEL}:a1" and message.content


def test_an_unknown_adapter_is_model_not_found(http, cluster):
    r = http.post("/v1/chat/completions", json={"model": f"{MODEL}:nope", "messages": QUESTION, "max_tokens": 4})
    assert r.status_code == 404, r.text
    assert r.json()["error"]["code"] == "model_not_found" and r.json()["error"]["param"] == "model"
    assert_valid("ErrorResponse", r.json())
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": QUESTION, "max_tokens": 4,
                                                "lora": [{"name": "nope", "scale": 1}]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    assert r.json()["error"]["param"] == "lora[0].name"
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 4, "lora": [{"id": 7}]})
    assert r.status_code == 404 and r.json()["error"]["param"] == "lora[0].id", r.text
    r = http.post("/v1/responses", json={"model": f"{MODEL}:nope", "input": "hi", "max_output_tokens": 4})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text

    sdk = anthropic.Anthropic(base_url=cluster.url, api_key=KEY_A, max_retries=0, timeout=120)
    with pytest.raises(anthropic.NotFoundError) as info:
        sdk.messages.create(model=f"{MODEL}:nope", max_tokens=4, messages=QUESTION)
    assert info.value.body["error"]["type"] == "not_found_error"
    assert_valid_error(info.value.response.json())


@pytest.mark.parametrize("scale", ["11", "-10.5", '"1"', "1e999"])
def test_a_bad_scale_is_a_400_naming_it(http, scale):
    body = (f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "hi"}}], "max_tokens": 4, '
            f'"lora": [{{"name": "a1", "scale": {scale}}}]}}')
    r = http.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    if scale != "1e999":  # the JSON reader refuses a number past float's range before any field is read
        assert r.json()["error"]["param"] == "lora[0].scale", r.text


def test_base_and_two_adapters_at_once_each_reply_as_alone(http):
    """Each reply under concurrent load is its model's (base or adapter) reply alone, up to near-ties: two
    requests under one adapter decode in one batch, which moves llama.cpp's sums in the last bits
    (tests/support/ties.py). An adapter mixed up with another parts where the model is far from a tie."""
    models = [MODEL, *(f"{MODEL}:{a}" for a in ADAPTERS)]

    def reply(model: str) -> dict:
        return chat(http, model, max_tokens=24, logprobs=True, top_logprobs=2)["choices"][0]

    alone = {m: reply(m) for m in models}
    assert len({c["message"]["content"] for c in alone.values()}) == len(models), alone  # three replies to tell apart
    with ThreadPoolExecutor(len(models) * 2) as pool:
        together = list(pool.map(lambda m: (m, reply(m)), models * 2))
    equal = [same_up_to_a_tie(alone[m]["logprobs"]["content"], c["logprobs"]["content"]) for m, c in together]
    assert sum(equal) >= len(equal) - 2, equal  # parting at a near-tie is allowed, not expected
