"""`llamaray check-config` says where each model comes from and whether its remote header was readable."""

from __future__ import annotations

import yaml

from app.ops.cli import main
from tests.support.fake_hub import COMMIT, FILE, REPO
from tests.support.serve_harness import BUNDLED


def test_check_config_reports_each_source_and_its_header(hub, tmp_path, capsys):
    config = {"applications": [{"name": "llamaray", "args": {"models": [
        {"id": "local", "model_path": BUNDLED},
        {"id": "hub", "model_path": f"{REPO}:Q4_1"},
        {"id": "gone", "model_path": "hf://test-org/gone/m.gguf", "chat_template": "{{ messages }}"},
    ]}}]}
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    # three one-CPU models: more than a 2-core machine holds, which is not what this test is about
    assert main(["check-config", str(path), "--capacity", "none"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3, out
    assert out[0].startswith("llamaray: llamaray: model 'local' (chat): /") and "metadata read from it" in out[0]
    assert out[1] == (f"llamaray: llamaray: model 'hub' (chat): hf://{REPO}/{FILE}@{COMMIT} (fetched by each node that runs "
                      f"it, into its model cache); header read by range requests")
    assert "model 'gone' (chat): hf://test-org/gone/m.gguf" in out[2] and "header NOT readable (" in out[2]
    assert "not found" in out[2] and "the configured chat_template is used" in out[2]
    assert hub.gets[(REPO, FILE)] == 0


def test_check_config_fails_on_a_header_it_needs_and_cannot_read(hub, tmp_path, capsys):
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump({"applications": [{"name": "a", "args": {"models": [
        {"id": "gone", "model_path": "hf://test-org/gone/m.gguf"}]}}]}))
    assert main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "cannot read the GGUF header of 'hf://test-org/gone/m.gguf'" in err and "set `chat_template`" in err


def test_a_pools_hub_list_is_read_from_the_hub_like_any_model_source(hub, tmp_path, capsys):
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump({"applications": [{"name": "llamaray", "args": {
        "models": [], "pools": [{"name": "tail", "hub": [f"{REPO}:Q4_1"]}]}}]}))
    assert main(["check-config", str(path), "--capacity", "none"]) == 0
    out = capsys.readouterr().out
    assert f"model '{REPO}:Q4_1' (chat): hf://{REPO}/{FILE}@{COMMIT}" in out and "header read by range requests" in out
