"""Hostile and unlucky model sources: a leftover `.part` that is not the object's first bytes, credentials
written in a source URL, and a node (or head) without the Hub that must use what its cache holds."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from app.config.resolution import resolve_model
from app.config.schema import ConfigError, ModelConfig
from app.model_sources import fetch as fetch_module
from app.model_sources.cache import url_dir
from app.model_sources.fetch import FetchError, fetch
from app.model_sources.header import pin
from app.replica.local_copy import fetch_spec
from app.model_sources.progress import Progress
from app.model_sources.redact import redacted, without_userinfo
from app.model_sources.source import SourceError, parse_source
from tests.support.fake_hub import COMMIT, FILE, REPO, FakeHub

SECRET = "s3cr3t-Pa55"
USER = "alice-user"


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def quiet() -> Progress:
    return Progress("x", say=lambda _: None)


class Cut(Exception):
    """The download is cut off (the replica killed, the connection gone)."""


class CutAfter(Progress):
    """Progress that cuts the download off once `limit` bytes have come."""

    def __init__(self, limit: int) -> None:
        super().__init__("x", say=lambda _: None)
        self.limit = limit

    def advance(self, n: int) -> None:
        super().advance(n)
        if self.done >= self.limit:
            raise Cut()


def interrupted(url: str, root: Path) -> Path:
    """Start fetching `url` and cut it off after its first block: the `.part` an earlier try leaves."""
    with pytest.raises(FetchError, match="Cut"):
        fetch(parse_source(url), root, CutAfter(1))
    part = url_dir(root, url) / (url.rsplit("/", 1)[1] + ".part")
    assert 0 < part.stat().st_size
    return part


# --- a leftover .part ----------------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [-(1 << 20), 1 << 20], ids=["shorter", "longer"])
def test_a_leftover_part_that_is_not_this_objects_is_never_installed(hub, tmp_path, roomy, gguf_path, extra):
    url = f"{hub.url}/{REPO}/resolve/main/{FILE}"
    folder = url_dir(tmp_path, url)
    folder.mkdir(parents=True)
    (folder / (FILE + ".part")).write_bytes(b"\xa5" * (gguf_path.stat().st_size + extra))
    path = fetch(parse_source(url), tmp_path, quiet())
    assert sha256_of(path) == hub.sha256(gguf_path), "junk from a leftover .part became the model"
    assert sorted(p.name for p in folder.iterdir()) == [FILE]


def test_a_junk_part_with_sha256_is_discarded_not_a_lasting_mismatch(hub, tmp_path, roomy, gguf_path):
    url = f"{hub.url}/{REPO}/resolve/main/{FILE}"
    folder = url_dir(tmp_path, url)
    folder.mkdir(parents=True)
    (folder / (FILE + ".part")).write_bytes(b"\xa5" * (3 << 20))
    path = fetch(parse_source(url), tmp_path, quiet(), sha256=hub.sha256(gguf_path))
    assert sha256_of(path) == hub.sha256(gguf_path)


def test_an_interrupted_download_resumes_from_where_it_stopped(hub, tmp_path, roomy, gguf_path):
    url = f"{hub.url}/{REPO}/resolve/main/{FILE}"
    part = interrupted(url, tmp_path)
    kept = part.stat().st_size
    sent_before = hub.range_bytes[(REPO, FILE)] + hub.gets[(REPO, FILE)]
    progress = quiet()
    path = fetch(parse_source(url), tmp_path, progress, sha256=hub.sha256(gguf_path))
    assert sha256_of(path) == hub.sha256(gguf_path)
    assert hub.range_bytes[(REPO, FILE)] - sent_before == gguf_path.stat().st_size - kept, "it did not resume"
    assert progress.done == gguf_path.stat().st_size
    assert sorted(p.name for p in path.parent.iterdir()) == [FILE]


def test_a_resumed_part_that_fails_the_checksum_is_fetched_again_from_zero(hub, tmp_path, roomy, gguf_path):
    url = f"{hub.url}/{REPO}/resolve/main/{FILE}"
    part = interrupted(url, tmp_path)
    with open(part, "r+b") as f:  # its record says it is this object's, but its bytes are not
        f.write(b"\0" * 4096)
    progress = quiet()
    path = fetch(parse_source(url), tmp_path, progress, sha256=hub.sha256(gguf_path))
    assert sha256_of(path) == hub.sha256(gguf_path)
    assert progress.done == gguf_path.stat().st_size


def test_a_part_of_another_version_of_the_object_is_discarded(hub, tmp_path, roomy, gguf_path):
    url = f"{hub.url}/{REPO}/resolve/main/{FILE}"
    part = interrupted(url, tmp_path)
    record = part.with_name(part.name + ".id")
    record.write_text(json.dumps({**json.loads(record.read_text()), "ETag": '"an-older-version"'}))
    with open(part, "r+b") as f:
        f.write(b"\0" * 4096)
    path = fetch(parse_source(url), tmp_path, quiet())  # no sha256: only the record can tell
    assert sha256_of(path) == hub.sha256(gguf_path)


class SizelessFs:
    """A file system whose objects declare no size (an HTTP server without Content-Length)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def info(self, path):
        return {"name": path, "size": None}

    def open(self, path, mode, block_size=None):
        return io.BytesIO(self.data)


def test_without_a_declared_size_a_leftover_part_is_never_resumed(tmp_path, monkeypatch, roomy):
    data = b"GGUF" + bytes(range(256)) * 64
    monkeypatch.setattr(fetch_module, "open_url_fs", lambda url: (SizelessFs(data), "m.gguf"))
    url = "https://models.example/m.gguf"
    folder = url_dir(tmp_path, url)
    folder.mkdir(parents=True)
    (folder / "m.gguf.part").write_bytes(b"\xa5" * 100)
    (folder / "m.gguf.part.id").write_text(json.dumps({"size": None}))
    path = fetch(parse_source(url), tmp_path, quiet())
    assert path.read_bytes() == data


def test_a_fresh_download_that_fails_its_checksum_is_still_a_lasting_failure(hub, tmp_path, roomy):
    url = f"{hub.url}/{REPO}/resolve/main/{FILE}"
    with pytest.raises(FetchError) as err:
        fetch(parse_source(url), tmp_path, quiet(), sha256="0" * 64)
    assert err.value.reason == "checksum" and err.value.lasting
    assert not list(url_dir(tmp_path, url).iterdir())


# --- credentials in a source URL ----------------------------------------------------------------------


@pytest.mark.parametrize("text, shown", [
    (f"https://{USER}:{SECRET}@models.example/a/m.gguf", "https://***@models.example/a/m.gguf"),
    (f"s3://AKIA:{SECRET}@bucket/m.gguf", "s3://***@bucket/m.gguf"),
    (f"error for url='http://{USER}:{SECRET}@h:1/x.gguf' (404)", "error for url='http://***@h:1/x.gguf' (404)"),
    (f"https://{USER}:p@ss@h/m.gguf", "https://***@h/m.gguf"),
    ("hf://org/repo/m.gguf@v1.0", "hf://org/repo/m.gguf@v1.0"),
    ("https://h/path/with@sign/m.gguf", "https://h/path/with@sign/m.gguf"),
])
def test_redacted_hides_userinfo_and_nothing_else(text, shown):
    assert redacted(text) == shown


def test_credentials_never_reach_the_cache_the_progress_errors_or_logs(hub, tmp_path, roomy, caplog):
    caplog.set_level(logging.DEBUG)
    url = hub.url.replace("http://", f"http://{USER}:{SECRET}@") + f"/{REPO}/resolve/main/{FILE}"
    source = parse_source(url)
    said: list[str] = []
    progress = Progress(source.canonical(), say=said.append, every_s=0)
    path = fetch(source, tmp_path, progress)
    assert path.is_file()
    plain = url_dir(tmp_path, without_userinfo(url))
    assert path.parent == plain, "the same object has one cache folder whatever the credentials"
    names = [str(p) for p in tmp_path.rglob("*")]
    with pytest.raises(FetchError) as err:
        fetch(parse_source(url.replace(FILE, "missing.gguf")), tmp_path, quiet())
    seen = [*names, progress.text(), *said, str(err.value), caplog.text, source.shown()]
    assert not [s for s in seen if SECRET in s or USER in s], seen
    assert "***@" in str(err.value) and err.value.reason == "not_found"
    basic = "Basic " + base64.b64encode(f"{USER}:{SECRET}".encode()).decode()
    assert set(hub.authorizations) == {basic}, "the credentials were not sent"


def test_credentials_are_hidden_in_config_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMARAY_MODEL_CACHE", str(tmp_path))
    with pytest.raises(SourceError) as err:
        parse_source(f"https://{USER}:{SECRET}@h/model.bin")
    assert SECRET not in str(err.value) and "https://***@h/model.bin" in str(err.value)
    with pytest.raises(ConfigError) as err:  # nothing listens on port 9: the header cannot be read
        resolve_model(ModelConfig(id="m", model_path=f"http://{USER}:{SECRET}@127.0.0.1:9/m.gguf"))
    assert SECRET not in str(err.value) and USER not in str(err.value) and "http://***@127.0.0.1:9/m.gguf" in str(err.value)


def test_an_unreachable_url_with_a_chat_template_builds_from_the_config(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMARAY_MODEL_CACHE", str(tmp_path))
    spec = resolve_model(ModelConfig(id="m", model_path=f"http://{USER}:{SECRET}@127.0.0.1:9/m.gguf",
                                     chat_template="{{ messages }}"))
    assert spec.metadata_from == "config" and spec.source == f"http://{USER}:{SECRET}@127.0.0.1:9/m.gguf"
    assert "http://***@127.0.0.1:9/m.gguf" in spec.metadata_note and SECRET not in spec.metadata_note


def test_check_config_shows_a_source_without_its_credentials(hub, tmp_path, capsys, monkeypatch):
    from app.ops.cli import main

    monkeypatch.setenv("LLAMARAY_MODEL_CACHE", str(tmp_path / "cache"))
    url = hub.url.replace("http://", f"http://{USER}:{SECRET}@") + f"/{REPO}/resolve/main/{FILE}"
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump({"applications": [{"name": "a", "args": {"models": [
        {"id": "m", "model_path": url}]}}]}))
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err and USER not in out.out + out.err
    assert "http://***@127.0.0.1" in out.out and "header read by range requests" in out.out


def test_preparation_reports_a_failure_without_credentials(bundled_spec, tmp_path, caplog, monkeypatch):
    from app.replica.preparation import Preparation
    from tests.support.waiting import wait_for

    monkeypatch.setenv("LLAMARAY_MODEL_CACHE", str(tmp_path))
    spec = replace(bundled_spec, path="", source=f"http://{USER}:{SECRET}@127.0.0.1:9/m.gguf")
    prep = Preparation(spec, lambda _: None)
    assert wait_for(lambda: prep.state() is not None and prep.state().state == "failed", 30), prep.state()
    assert "http://***@127.0.0.1:9/m.gguf" in prep.state().reason and prep.failure.reason == "network"
    assert SECRET not in prep.state().reason and SECRET not in prep.progress.text() and SECRET not in caplog.text


def test_s3_credentials_in_the_url_are_given_to_s3fs_not_left_in_the_path():
    pytest.importorskip("s3fs")
    fs, path = fetch_module.open_url_fs("s3://AKIAEXAMPLE:se%2Fcret@bucket/models/m.gguf")
    assert (fs.key, fs.secret) == ("AKIAEXAMPLE", "se/cret") and path == "bucket/models/m.gguf"


# --- without the Hub: what the cache holds ------------------------------------------------------------


@pytest.fixture
def warm_cache(gguf_path, tmp_path, monkeypatch, roomy):
    """A model cache warmed through the stand-in Hub the way a replica warms it (by commit); then the Hub
    is gone (stopped, and HF_HUB_OFFLINE set as an operator would)."""
    import huggingface_hub.constants

    root = tmp_path / "cache"
    with FakeHub({REPO: {FILE: gguf_path, "README.md": gguf_path}}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        fetch(pin(parse_source(f"{REPO}:Q4_1")), root, quiet())
    assert not (root / "hub" / f"models--{REPO.replace('/', '--')}" / "refs").exists() or not list(
        (root / "hub" / f"models--{REPO.replace('/', '--')}" / "refs").iterdir()), "a download by commit wrote a ref"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read by huggingface_hub at import
    monkeypatch.setenv("LLAMARAY_MODEL_CACHE", str(root))
    return root


@pytest.mark.parametrize("model_path, chat_template", [
    (f"{REPO}:Q4_1", None),
    (f"hf://{REPO}/{FILE}", None),
    (f"hf://{REPO}/{FILE}@{COMMIT}", "{{ messages }}"),
    (f"{REPO}:q4_1@main", "{{ messages }}"),
    (f"hf://{REPO}/{FILE}@main", "{{ messages }}"),
])
def test_offline_the_builder_pins_and_reads_the_header_from_the_cache(warm_cache, model_path, chat_template):
    spec = resolve_model(ModelConfig(id="m", model_path=model_path, chat_template=chat_template))
    assert spec.source == f"hf://{REPO}/{FILE}@{COMMIT}"
    assert spec.metadata_from == "header" and spec.n_vocab == 49152, spec.metadata_note
    local = fetch_spec(spec, quiet())
    assert Path(local.path).is_file() and Path(local.path).name == FILE


def test_offline_check_config_passes_on_a_warm_cache(warm_cache, tmp_path, capsys):
    from app.ops.cli import main

    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump({"applications": [{"name": "a", "args": {"models": [
        {"id": "m", "model_path": f"{REPO}:Q4_1"},
        {"id": "t", "model_path": f"hf://{REPO}/{FILE}@{COMMIT}", "chat_template": "{{ messages }}"}]}}]}))
    assert main(["check-config", str(path)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.count(f"hf://{REPO}/{FILE}@{COMMIT}") == 2 and out.count("header read by range requests") == 2


@pytest.mark.parametrize("text", [f"hf://{REPO}/{FILE}", f"hf://{REPO}/{FILE}@main"])
def test_offline_a_replica_finds_an_unpinned_source_among_the_cached_snapshots(warm_cache, text):
    path = fetch(parse_source(text), warm_cache, quiet())
    assert path.is_file() and path.parent.name == COMMIT


def test_without_network_and_without_offline_mode_the_cache_is_used(warm_cache, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: connection refused
    spec = resolve_model(ModelConfig(id="m", model_path=f"{REPO}:Q4_1"))
    assert spec.source == f"hf://{REPO}/{FILE}@{COMMIT}" and spec.metadata_from == "header"
    assert fetch(parse_source(f"hf://{REPO}/{FILE}"), warm_cache, quiet()).is_file()


def test_offline_a_cold_cache_still_says_why(warm_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMARAY_MODEL_CACHE", str(tmp_path / "cold"))
    with pytest.raises(ConfigError, match="cannot read the GGUF header"):
        resolve_model(ModelConfig(id="m", model_path=f"{REPO}:Q4_1"))
    with pytest.raises(FetchError) as err:
        fetch(parse_source(f"hf://{REPO}/{FILE}@{COMMIT}"), tmp_path / "cold", quiet())
    assert err.value.reason == "offline" and "not in this node's cache" in str(err.value)


def test_a_cached_commit_is_not_taken_for_another_commit(warm_cache):
    other = "f" * 40
    with pytest.raises(FetchError) as err:
        fetch(parse_source(f"hf://{REPO}/{FILE}@{other}"), warm_cache, quiet())
    assert err.value.reason == "offline"
