"""Ollama's API in both topologies with the official `ollama` client, on the shared clusters (keys required: the
client sends its key in `headers=`): list, show and ps name the models as Ollama clients expect; chat and generate,
whole and streamed (and raw), over the bundled model; an image through the colour projector; embeddings from the
real embedder; a key limited to the base model sees only it (an adapter is a 404, the listing leaves it out);
model management refused; and /metrics on the API's port with the model replicas' vLLM-named series."""

from __future__ import annotations

import base64
import time

import httpx
import ollama
import pytest

from tests.support.hostile_images import solid
from tests.support.serve_harness import (
    ADAPTERS, EMBED_MODEL, KEY_A, MODEL, RERANK_MODEL, TENANT_KEYS, THINK_MODEL, THINKING_MODEL,
)

pytestmark = pytest.mark.timeout(300)
SHORT = {"num_predict": 4, "temperature": 0}


def client(cluster, key: str = KEY_A) -> ollama.Client:
    return ollama.Client(host=cluster.url, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def test_models_as_ollama_lists_shows_and_runs_them(cluster):
    api = client(cluster)
    listed = {m.model for m in api.list().models}
    assert listed == {f"{MODEL}:latest", *(f"{MODEL}:{a}" for a in ADAPTERS), f"{THINK_MODEL}:latest",
                      f"{THINKING_MODEL}:latest", f"{EMBED_MODEL}:latest"}  # no reranker: no Ollama route serves one
    assert RERANK_MODEL not in str(listed)
    shown = api.show(f"{MODEL}:latest")
    assert shown.capabilities == ["completion", "tools", "vision"] and shown.details.family == "llama"
    assert api.show(f"{MODEL}:{ADAPTERS[0]}").details.parent_model == f"{MODEL}:latest"
    assert "thinking" in api.show(THINK_MODEL).capabilities
    assert {m.model for m in api.ps().models} == listed  # every model here has a deployment of its own: loaded
    assert api.generate(model=MODEL).done_reason == "load"


def test_chat_and_generate_whole_and_streamed(cluster):
    api = client(cluster)
    messages = [{"role": "user", "content": "Name a colour."}]
    whole = api.chat(model=f"{MODEL}:latest", messages=messages, options=SHORT)
    assert whole.message.content and (whole.done_reason, whole.eval_count) == ("length", 4)
    assert whole.model == f"{MODEL}:latest"  # the name sent, across the hop, though the id served it
    assert whole.prompt_eval_count > 5 and whole.total_duration > 0
    parts = list(api.chat(model=MODEL, messages=messages, options=SHORT, stream=True))
    assert parts[-1].done and parts[-1].eval_count == 4 and all(not p.done for p in parts[:-1])
    assert "".join(p.message.content for p in parts)
    generated = api.generate(model=MODEL, prompt="Once upon a time", options=SHORT)
    raw = list(api.generate(model=MODEL, prompt="Once upon a time", raw=True, options=SHORT, stream=True))
    assert generated.response and generated.eval_count == raw[-1].eval_count == 4
    assert raw[-1].prompt_eval_count < generated.prompt_eval_count  # no template around a raw prompt
    adapted = api.chat(model=f"{MODEL}:{ADAPTERS[0]}", messages=messages, options=SHORT)
    assert adapted.model == f"{MODEL}:{ADAPTERS[0]}" and adapted.eval_count == 4


def test_generate_with_a_suffix_fills_in_the_middle(cluster, http):
    """`suffix` on /api/generate (as Continue and Twinny send it) is the model's FIM layout: its prompt counts the
    tokens /tokenize gives for /infill's fields; a model without FIM tokens is Ollama's 400 naming it."""
    prefix, suffix = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"
    filled = client(cluster).generate(model=THINKING_MODEL, prompt=prefix, suffix=suffix,
                                      options={"num_predict": 8, "temperature": 0})
    layout = http.post("/tokenize", json={"model": THINKING_MODEL, "input_prefix": prefix, "input_suffix": suffix})
    assert layout.status_code == 200, layout.text
    assert filled.prompt_eval_count == layout.json()["count"] and filled.done and 1 <= filled.eval_count <= 8
    with pytest.raises(ollama.ResponseError) as refused:  # no FIM tokens in the plain bundled GGUF
        client(cluster).generate(model=MODEL, prompt=prefix, suffix=suffix, options=SHORT)
    assert refused.value.status_code == 400 and MODEL in refused.value.error


def test_an_image_reaches_the_model(cluster):
    image = base64.b64encode(solid((0, 0, 255), (64, 48))).decode()
    reply = client(cluster).chat(model=MODEL, options={"num_predict": 12, "temperature": 0},
                                 messages=[{"role": "user", "content": "What colour is it?", "images": [image]}])
    assert "blue" in reply.message.content.lower(), reply.message.content


def test_embeddings_from_the_real_embedder(cluster):
    api = client(cluster)
    reply = api.embed(model=f"{EMBED_MODEL}:latest", input=["The sky is blue.", "Grass is green."])
    assert [len(v) for v in reply.embeddings] == [384, 384] and reply.prompt_eval_count > 4
    assert abs(sum(x * x for x in reply.embeddings[0]) - 1) < 1e-3  # unit length
    assert len(api.embeddings(model=EMBED_MODEL, prompt="The sky is blue.").embedding) == 384


def test_a_key_sees_and_reaches_only_its_models(cluster):
    api = client(cluster, TENANT_KEYS["base-only"][0])
    assert {m.model for m in api.list().models} == {f"{MODEL}:latest"}
    for call in (lambda: api.chat(model=f"{MODEL}:{ADAPTERS[0]}", messages=[{"role": "user", "content": "x"}]),
                 lambda: api.show(THINK_MODEL), lambda: api.embed(model=EMBED_MODEL, input="x")):
        with pytest.raises(ollama.ResponseError) as info:
            call()
        assert info.value.status_code == 404 and "not found" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        client(cluster).pull("llama3")
    assert info.value.status_code == 403 and "config" in info.value.error


def test_hostile_options_are_refused_before_the_model(cluster, http):
    with pytest.raises(ollama.ResponseError) as info:
        client(cluster).chat(model=MODEL, messages=[{"role": "user", "content": "x"}], options={"mirostat": 2})
    assert info.value.status_code == 400 and "options.mirostat" in info.value.error
    raw = b'{"model": "%s", "prompt": "x", "options": {"temperature": NaN}}' % MODEL.encode()
    r = http.post("/api/generate", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and set(r.json()) == {"error"} and "not finite" in r.json()["error"]
    r = http.post("/api/generate", json={"model": MODEL, "prompt": "x", "options": {"num_ctx": 10**6}})
    assert r.status_code == 400 and "options.num_ctx" in r.json()["error"]


def test_metrics_on_the_api_port(cluster):
    """The node's series of this application, behind the key check; a key limited to the base model reads none
    of the other models'."""
    url = f"{cluster.url}/metrics"
    assert httpx.get(url, timeout=30).status_code == 401
    assert client(cluster).generate(model=MODEL, prompt="Hi", options={"num_predict": 1}).eval_count == 1
    wanted = f'model_name="{MODEL}"'
    deadline, text = time.monotonic() + 60, ""
    while time.monotonic() < deadline:  # Ray's agent reports each process's metrics every few seconds
        r = httpx.get(url, headers=cluster.headers, timeout=30)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text[:300]
        text = r.text
        if any(line.startswith("ray_vllm_") and wanted in line for line in text.splitlines()):
            break
        time.sleep(1)
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert any(s.startswith("ray_vllm_time_to_first_token_seconds_bucket") and wanted in s for s in samples), samples[:5]
    assert all(s.startswith(("ray_llamaray_", "ray_vllm_")) and 'application="llamaray"' in s for s in samples)
    narrow = httpx.get(url, headers={"Authorization": f"Bearer {TENANT_KEYS['base-only'][0]}"}, timeout=30).text
    assert wanted in narrow and f'model_name="{THINK_MODEL}"' not in narrow and 'key="rate"' not in narrow
