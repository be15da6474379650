"""A chat model's `adapters:`: names, sources and scales checked when the args are read; each adapter checked
against the model's GGUF by check-config and the builder (app/ops/adapter_check.py, app/engine/lora's checks),
so one made for another base is a config error naming both; refused where they mean nothing."""

from __future__ import annotations

import pytest
import yaml

from app.config.app_args import parse_args
from app.config.resolution import resolve_model
from app.config.schema import ModelConfig
from app.ops.adapter_check import check_adapters
from app.ops.cli import main as cli_main
from app.ops.config_check import check_config
from tests.config.test_config import BUNDLED, SERVE_CONFIG, config_error
from tools.make_lora import write_lora


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    d = tmp_path_factory.mktemp("adapters")
    return {"a1": str(write_lora(d / "a1.gguf", seed=1)), "wrong": str(write_lora(d / "w.gguf", wrong_base=True)),
            "qwen": str(write_lora(d / "q.gguf", arch="qwen2"))}


def model(*entries, **fields) -> ModelConfig:
    return ModelConfig(id="base", model_path=BUNDLED, adapters=list(entries), **fields)


def test_adapters_resolve_to_local_files_with_their_scales(adapters):
    spec = resolve_model(model({"name": "a1", "path": adapters["a1"]}, {"name": "half", "path": adapters["a1"],
                                                                        "scale": 0.5}))
    assert [(a.name, a.path, a.scale, a.source) for a in spec.adapters] == [
        ("a1", adapters["a1"], 1.0, ""), ("half", adapters["a1"], 0.5, "")]
    check_adapters(spec)  # made for the bundled model: fits


@pytest.mark.parametrize("name", ["wrong", "qwen"])
def test_an_adapter_for_another_base_is_a_config_error_naming_both(adapters, name):
    spec = resolve_model(model({"name": name, "path": adapters[name]}))
    msg = config_error(check_adapters, spec)
    assert "'base'" in msg and f"`{name}`" in msg and adapters[name] in msg and "SmolLM2" in msg, msg


def test_a_missing_adapter_file_is_named(tmp_path):
    msg = config_error(resolve_model, model({"name": "gone", "path": str(tmp_path / "gone.gguf")}))
    assert "'gone'" in msg and "does not exist" in msg


@pytest.mark.parametrize("models,says", [
    ([{"id": "m", "model_path": BUNDLED, "adapters": [{"name": "a:b", "path": "x.gguf"}]}], "no ':'"),
    ([{"id": "m", "model_path": BUNDLED, "adapters": [{"name": "a", "path": "x.gguf", "scale": 11}]}], "scale"),
    ([{"id": "m", "model_path": BUNDLED, "adapters": [{"name": "a", "path": "x.gguf", "bogus": 1}]}], "unknown key"),
    ([{"id": "m", "model_path": BUNDLED, "adapters": [{"name": "a", "path": "x.gguf"}, {"name": "a", "path": "y.gguf"}]}],
     "configured twice"),
    ([{"id": "m", "model_path": BUNDLED, "adapters": [{"name": "a", "path": "x.gguf"}]},
      {"id": "m:a", "model_path": BUNDLED}], "also a model's id"),
    ([{"id": "e", "kind": "embedding", "model_path": BUNDLED, "adapters": [{"name": "a", "path": "x.gguf"}]}],
     "`adapters`"),
    ([{"id": "s", "engine": "synthetic", "adapters": [{"name": "a", "path": "x.gguf"}]}], "engine: llama"),
    ([{"id": "m", "model_path": BUNDLED, "adapters": [{"name": "a", "path": "hf://org/repo"}]}], "file"),
])
def test_what_the_args_refuse(models, says):
    msg = config_error(parse_args, {"models": models})
    assert says in msg, msg


def _app(adapters):
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    config["applications"][0]["args"]["models"][0]["adapters"] = adapters
    return config


def test_check_config_checks_adapters_against_the_model(adapters, tmp_path, capsys):
    assert check_config(_app([{"name": "a1", "path": adapters["a1"]}])) == []
    notes: list[str] = []
    check_config(_app([{"name": "a1", "path": adapters["a1"]}]), notes=notes)
    assert any("LoRA adapters a1 (checked against the model)" in n for n in notes), notes
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_app([{"name": "w", "path": adapters["wrong"]}])))
    assert cli_main(["check-config", str(path)]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert "smollm2-135m" in line and "`w`" in line and "another base model" in line, line
