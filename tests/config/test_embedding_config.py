"""Embedding model entries (`kind: embedding`): what they take from the GGUF, what they refuse, and the
message `check-config` prints for a chat-only key."""

from __future__ import annotations

import pytest
import yaml

from app.config.app_args import parse_args
from app.config.resolution import resolve_model
from app.config.schema import ConfigError, ModelConfig
from app.ops.cli import main as cli_main
from tests.support.serve_harness import BUNDLED, ROOT


def embedding(gguf: str, **kw) -> ModelConfig:
    return ModelConfig(id="emb", kind="embedding", model_path=gguf, **kw)


def error(fn, *args) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_pooling_context_and_size_come_from_the_gguf(minilm_gguf):
    spec = resolve_model(embedding(minilm_gguf))
    assert (spec.kind, spec.pooling, spec.n_embd, spec.normalize) == ("embedding", "mean", 384, True)
    assert spec.n_ctx == 512 and spec.n_batch >= 512  # the trained context, not the chat default 4096
    assert spec.chat_template == ""
    assert resolve_model(embedding(minilm_gguf, pooling="cls", normalize=False)).pooling == "cls"


def test_an_embedding_context_fits_what_the_model_reads(minilm_gguf):
    assert "trained on" in error(resolve_model, embedding(minilm_gguf, n_ctx=1024))
    assert "n_batch must be at least n_ctx" in error(resolve_model, embedding(minilm_gguf, n_ctx=256, n_batch=128))
    assert resolve_model(embedding(minilm_gguf, n_ctx=128)).n_batch == 512


def test_dimensions_past_the_vector_are_refused(minilm_gguf):
    assert resolve_model(embedding(minilm_gguf, dimensions=[256, 128])).dimensions == (128, 256)
    assert "larger than the model's vectors (384)" in error(resolve_model, embedding(minilm_gguf, dimensions=[512]))


def test_a_gguf_without_pooling_needs_it_set():
    """The bundled chat GGUF names no pooling: as an embedder it needs `pooling` (last, as a decoder)."""
    msg = error(resolve_model, ModelConfig(id="e", kind="embedding", model_path=BUNDLED))
    assert "set `pooling: mean`" in msg
    assert resolve_model(ModelConfig(id="e", kind="embedding", model_path=BUNDLED, pooling="last")).pooling == "last"


@pytest.mark.parametrize("key,value", [("chat_template", "{{ x }}"), ("reasoning_parser", "think"),
                                       ("tool_parser", "hermes"), ("default_max_tokens", 5), ("routing", "load")])
def test_chat_only_keys_are_refused_on_an_embedding_model(key, value):
    msg = error(parse_args, {"models": [{"id": "emb", "kind": "embedding", "model_path": "x.gguf", key: value}]})
    assert f"`{key}`" in msg and "kind: embedding" in msg and "models.0" in msg


@pytest.mark.parametrize("key,value", [("pooling", "mean"), ("normalize", False), ("dimensions", [64])])
def test_embedding_keys_are_refused_on_a_chat_model(key, value):
    msg = error(parse_args, {"models": [{"id": "chat", "model_path": "x.gguf", key: value}]})
    assert f"`{key}`" in msg and "chat model" in msg


def test_check_config_names_the_chat_only_key(tmp_path, capsys, minilm_gguf):
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["applications"][0]["args"]["models"].append(
        {"id": "minilm", "kind": "embedding", "model_path": minilm_gguf, "tool_parser": "hermes"})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli_main(["check-config", str(path)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "`tool_parser` apply to chat models" in lines[0] and "minilm" in lines[0]
