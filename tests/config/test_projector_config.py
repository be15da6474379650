"""A chat model's `mmproj_path`: refused at config time when it is missing, not a projector, has no vision
encoder, or was made for a model of another width; refused on an embedding model."""

from __future__ import annotations

import pytest

from app.config.resolution import resolve_model
from app.config.schema import ConfigError, ModelConfig
from tests.config.test_config import BUNDLED, config_error, write_gguf

SMOLLM2_WIDTH = 576  # llama.embedding_length of the bundled model


def projector(tmp_path, **kv):
    fields = {"general.architecture": "clip", "clip.has_vision_encoder": True,
              "clip.vision.projection_dim": SMOLLM2_WIDTH, **kv}
    return str(write_gguf(tmp_path / "mmproj.gguf", fields))


def chat_model(mmproj_path: str) -> ModelConfig:
    return ModelConfig(id="vlm", model_path=BUNDLED, mmproj_path=mmproj_path)


def test_a_projector_for_the_model_is_taken(tmp_path):
    path = projector(tmp_path)
    assert resolve_model(chat_model(path)).mmproj_path == path


def test_a_missing_projector_is_named(tmp_path):
    msg = config_error(resolve_model, chat_model(str(tmp_path / "nope.gguf")))
    assert "mmproj_path" in msg and "does not exist" in msg


@pytest.mark.parametrize("fields,says", [
    ({"general.architecture": "llama"}, "not a multimodal projector"),
    ({"clip.has_vision_encoder": False}, "no vision encoder"),
    ({"clip.vision.projection_dim": 2048}, "made for another model"),
])
def test_a_projector_that_does_not_fit_is_named(tmp_path, fields, says):
    assert says in config_error(resolve_model, chat_model(projector(tmp_path, **fields)))


def test_an_embedding_model_takes_no_projector(tmp_path):
    with pytest.raises((ConfigError, ValueError)) as info:
        ModelConfig(id="e", kind="embedding", model_path=BUNDLED, mmproj_path=projector(tmp_path))
    assert "mmproj_path" in str(info.value)


def test_check_config_says_what_each_model_serves_and_names_its_projector(tmp_path, capsys):
    import yaml

    from app.ops.cli import main

    config = {"applications": [{"name": "app", "import_path": "deployments.builder:build_app", "args": {
        "models": [{"id": "vlm", "model_path": BUNDLED, "mmproj_path": projector(tmp_path)}]}}]}
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    main(["check-config", str(path)])
    out = capsys.readouterr().out
    assert "model 'vlm' (chat)" in out and f"images through the projector {tmp_path / 'mmproj.gguf'}" in out
