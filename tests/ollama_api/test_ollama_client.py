"""Ollama's API through the official `ollama` client against the real processing and the real bundled model (no
Ray): list, show, ps, version, chat and generate whole and streamed, raw generation, a JSON schema `format`, a
request that only loads, embeddings (over stand-in vectors: tests/graph/test_ollama.py has the real embedder), and
the client's errors. Each reply is checked on its own (two greedy replies may part at a near-tie)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import ollama
import pytest

from app.config.app_args import Limits
from app.engine.jobs import TokenizeJob
from app.engine.params import EmbeddingJob, EmbeddingResult
from app.http.app import build_http_app
from app.http.auth import KeyChecker
from app.http.endpoints import ServerSettings
from app.http.model_cards import model_cards
from app.serving.processing import Processor
from tests.embeddings.test_embedding_service import spec as stand_in_spec
from tests.support.engine_errors import mapped_stream
from tests.support.events import wait_idle
from tests.support.ollama_client import drain, ollama_client

pytestmark = pytest.mark.timeout(300)
KEY = "sk-test-o-" + "o" * 22
SHORT = {"num_predict": 4, "temperature": 0}


class EngineModels:
    """The chat model's engine; four-dimension stand-in vectors for the embedding model."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def generate(self, model_id, gen):
        return mapped_stream(self.engine, gen, 0)

    async def run(self, model_id, job):
        if isinstance(job, EmbeddingJob):
            vectors = tuple(np.full(4, 0.5, dtype=np.float32) for _ in job.inputs)
            return EmbeddingResult(vectors, prompt_tokens=2 * len(job.inputs))
        if isinstance(job, TokenizeJob):
            return self.engine.tokenize(job.text, job.add_special)
        return self.engine.detokenize(job.tokens)


@pytest.fixture(scope="module")
def app(bundled_spec, engine):
    specs = [bundled_spec, stand_in_spec("embedding", "emb")]
    processor = Processor(specs, EngineModels(engine), Limits())
    settings = ServerSettings(keys=KeyChecker((KEY.encode(),)), stream_keepalive_s=0)
    yield build_http_app(processor, model_cards(specs), settings)
    asyncio.run(wait_idle(engine))


def call(app, method: str, *args, **kwargs):
    """One call of the official async client, whole or (stream=True) drained."""
    async def run():
        client = ollama_client(app, KEY)
        result = getattr(client, method)(*args, **kwargs)
        return await drain(result) if kwargs.get("stream") else await result
    return asyncio.run(run())


def test_the_models_as_ollamas_clients_list_and_show_them(app, bundled_spec):
    listed = {m.model: m for m in call(app, "list").models}
    assert set(listed) == {f"{bundled_spec.id}:latest", "emb:latest"}
    chat = listed[f"{bundled_spec.id}:latest"]
    assert chat.size == bundled_spec.file_bytes > 0 and chat.details.format == "gguf"
    assert (chat.details.family, chat.details.quantization_level) == ("llama", "Q4_1")
    shown = call(app, "show", f"{bundled_spec.id}:latest")
    assert shown.capabilities == ["completion", "tools"] and shown.template == bundled_spec.chat_template
    assert shown.modelinfo["llama.context_length"] == bundled_spec.n_ctx == 1024  # what it is served with
    assert f"num_ctx {bundled_spec.n_ctx}" in shown.parameters
    assert call(app, "show", "emb").capabilities == ["embedding"]
    running = call(app, "ps").models
    assert {m.model for m in running} == set(listed) and running[0].context_length == bundled_spec.n_ctx


def test_chat_whole_and_streamed(app, bundled_spec):
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour."}]
    whole = call(app, "chat", model=f"{bundled_spec.id}:latest", messages=messages, options=SHORT)
    assert whole.model == f"{bundled_spec.id}:latest" and whole.message.role == "assistant" and whole.message.content
    assert (whole.done, whole.done_reason, whole.eval_count) == (True, "length", 4)
    assert whole.prompt_eval_count > 10 and whole.total_duration >= whole.eval_duration > 0
    parts = call(app, "chat", model=bundled_spec.id, messages=messages, options=SHORT, stream=True)
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].done_reason == "length"
    assert "".join(p.message.content for p in parts) and parts[-1].eval_count == 4
    assert parts[-1].prompt_eval_count == whole.prompt_eval_count


def test_generate_templated_and_raw(app, bundled_spec):
    templated = call(app, "generate", model=bundled_spec.id, prompt="Once upon a time", options=SHORT)
    raw = call(app, "generate", model=bundled_spec.id, prompt="Once upon a time", raw=True, options=SHORT)
    assert templated.response and raw.response and templated.eval_count == raw.eval_count == 4
    assert raw.prompt_eval_count < templated.prompt_eval_count  # the template's turn markers are not in a raw prompt
    parts = call(app, "generate", model=bundled_spec.id, prompt="Once upon a time", raw=True, options=SHORT,
                 stream=True)
    assert parts[-1].done and parts[-1].eval_count == 4 and "".join(p.response for p in parts[:-1])


def test_a_json_schema_format_is_followed(app, bundled_spec):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    reply = call(app, "generate", model=bundled_spec.id, prompt="Is the sky blue? Answer in JSON.", format=schema,
                 options={"num_predict": 30, "temperature": 0})
    assert reply.done_reason == "stop"
    assert set(json.loads(reply.response)) == {"ok"}


def test_a_request_without_a_prompt_only_loads(app, bundled_spec):
    loaded = call(app, "generate", model=bundled_spec.id)
    assert (loaded.done, loaded.done_reason, loaded.response) == (True, "load", "")
    loaded = call(app, "chat", model=bundled_spec.id, messages=[], keep_alive=-1)
    assert loaded.done_reason == "load" and loaded.message.content == ""


def test_embeddings(app):
    reply = call(app, "embed", model="emb:latest", input=["a", "b"])
    assert reply.model == "emb:latest" and [len(v) for v in reply.embeddings] == [4, 4]
    assert reply.prompt_eval_count == 4
    assert len(call(app, "embeddings", model="emb", prompt="a").embedding) == 4
    assert call(app, "embed", model="emb", input="").embeddings == []  # no input: the model loaded only
    with pytest.raises(ollama.ResponseError) as info:
        call(app, "embed", model="emb", input=["a", ""])
    assert info.value.status_code == 400


def test_the_clients_errors(app, bundled_spec):
    for kwargs, status, says in (
            ({"model": "nothing"}, 404, 'model "nothing" not found'),
            ({"model": bundled_spec.id, "options": {"tfs_z": 0.5}}, 400, "options.tfs_z"),
            ({"model": bundled_spec.id, "options": {"num_ctx": 4096}}, 400, "options.num_ctx"),
            ({"model": bundled_spec.id, "keep_alive": "whenever"}, 400, "keep_alive"),
            ({"model": "emb"}, 400, "embedding model")):
        with pytest.raises(ollama.ResponseError) as info:
            call(app, "chat", messages=[{"role": "user", "content": "hi"}], **kwargs)
        assert info.value.status_code == status and says in info.value.error, info.value


def test_a_suffix_needs_a_model_with_fim_tokens(app, bundled_spec):
    """The bundled GGUF's metadata names no FIM tokens: Ollama's 400 naming the model (the graph test
    tests/graph/test_ollama.py fills in the middle with the GGUF written with them)."""
    with pytest.raises(ollama.ResponseError) as refused:
        call(app, "generate", model=bundled_spec.id, prompt="def f(", suffix="):\n", options=SHORT)
    assert refused.value.status_code == 400 and bundled_spec.id in refused.value.error
