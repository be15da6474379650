"""Reranker entries (`kind: rerank`): rank pooling required (from the GGUF or `pooling: rank`), the embedding
model's context rules, the keys they refuse, and the line `check-config` prints."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from app.config.resolution import resolve_model
from app.config.schema import ConfigError, ModelConfig
from app.ops.cli import main as cli_main
from tests.support.serve_harness import ROOT


def rerank(gguf: str, **kw) -> ModelConfig:
    return ModelConfig(id="rr", kind="rerank", model_path=gguf, **kw)


def error(fn, *args) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args)
    return str(info.value)


def test_a_reranker_takes_rank_pooling_and_its_context_from_the_gguf(reranker_gguf):
    spec = resolve_model(rerank(reranker_gguf))
    assert (spec.kind, spec.pooling, spec.n_ctx) == ("rerank", "rank", 512)
    assert "n_batch must be at least n_ctx" in error(resolve_model, rerank(reranker_gguf, n_ctx=256, n_batch=128))


def test_kind_and_pooling_must_agree(reranker_gguf, minilm_gguf):
    assert "needs a reranker" in error(resolve_model, rerank(minilm_gguf))
    assert resolve_model(rerank(minilm_gguf, pooling="rank")).pooling == "rank"
    assert "set `kind: rerank`" in error(resolve_model, ModelConfig(id="e", kind="embedding", model_path=reranker_gguf))
    with pytest.raises(ValidationError, match="kind: rerank"):
        ModelConfig(id="e", kind="embedding", model_path=minilm_gguf, pooling="rank")


def test_check_config_names_the_kind_for_a_refused_key(tmp_path, capsys, reranker_gguf):
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["applications"][0]["args"]["models"].append(
        {"id": "rr", "kind": "rerank", "model_path": reranker_gguf, "dimensions": [128]})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli_main(["check-config", str(path)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "`dimensions`" in lines[0] and "`kind: rerank`" in lines[0]
