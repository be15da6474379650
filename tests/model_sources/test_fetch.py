"""Fetching into a node's cache: once per node (lock), after a free-space check, checked by sha256, moved
into place when whole; through huggingface_hub against a stand-in Hub, and through fsspec over HTTP."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

from app.model_sources import cache
from app.model_sources.cache import DiskFull, cache_root, check_free_space, url_dir
from app.model_sources.fetch import FetchError, fetch, verify_sha256
from app.model_sources.header import pin
from app.model_sources.progress import Progress
from app.model_sources.source import parse_source

from tests.support.fake_hub import FILE, REPO


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_cache_root_env_then_setting_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("LLAMARAY_MODEL_CACHE", str(tmp_path / "env"))
    assert cache_root("/setting") == tmp_path / "env"
    monkeypatch.delenv("LLAMARAY_MODEL_CACHE")
    assert cache_root(str(tmp_path / "setting")) == tmp_path / "setting"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root(None) == tmp_path / "home" / ".cache" / "llamaray" / "models"


def test_url_dir_keeps_a_remote_folder_together_and_apart_from_others(tmp_path):
    a = url_dir(tmp_path, "s3://bucket/models/m-00001-of-00002.gguf")
    assert a == url_dir(tmp_path, "s3://bucket/models/m-00002-of-00002.gguf")
    assert a != url_dir(tmp_path, "s3://bucket/other/m-00001-of-00002.gguf")
    assert a.parent == tmp_path / "s3" / "bucket"


def test_free_space_check_names_both_figures(tmp_path):
    check_free_space(tmp_path, 10 << 20, free=(10 << 20) + cache.FREE_MARGIN_BYTES)
    with pytest.raises(DiskFull, match=r"has 1\.0 GiB free, the download needs 10\.0 GiB plus 1\.0 GiB"):
        check_free_space(tmp_path, 10 << 30, free=1 << 30)


def test_the_hub_file_arrives_and_a_second_fetch_downloads_nothing(hub, tmp_path, roomy):
    source = pin(parse_source(f"{REPO}:q4_1"))
    said: list[str] = []
    progress = Progress(source.canonical(), every_s=3600, say=said.append)
    path = fetch(source, tmp_path, progress, sha256=hub.sha256(hub.repos[REPO][FILE]))
    assert path.name == FILE and path.parent.parent.parent == tmp_path / "hub" / f"models--{REPO.replace('/', '--')}"
    assert sha256_of(path) == hub.sha256(hub.repos[REPO][FILE])
    assert hub.gets[(REPO, FILE)] == 1
    assert progress.done == path.stat().st_size and "(100%)" in progress.text()
    assert [s for s in said if "%" in s], f"no progress lines (every tenth of the file): {said}"
    assert fetch(source, tmp_path, Progress("again")) == path
    assert hub.gets[(REPO, FILE)] == 1


def test_two_replicas_on_one_node_download_once(hub, tmp_path, roomy):
    source = pin(parse_source(f"hf://{REPO}/{FILE}"))
    progresses = [Progress(source.canonical(), say=lambda _: None) for _ in range(2)]
    paths: list[Path] = []
    threads = [threading.Thread(target=lambda p=p: paths.append(fetch(source, tmp_path, p))) for p in progresses]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(paths) == 2 and paths[0] == paths[1]
    assert hub.gets[(REPO, FILE)] == 1
    assert sorted(p.done for p in progresses) == [0, paths[0].stat().st_size]


def test_no_room_refuses_before_any_download(hub, tmp_path, monkeypatch):
    monkeypatch.setattr("shutil.disk_usage", lambda _: type("U", (), {"free": 1 << 20})())
    with pytest.raises(FetchError) as err:
        fetch(pin(parse_source(f"hf://{REPO}/{FILE}")), tmp_path, Progress("x"))
    assert err.value.reason == "disk_full" and "1.0 MiB free" in str(err.value) and not err.value.lasting
    assert hub.gets[(REPO, FILE)] == 0


def test_checksum_mismatch_is_named(hub, tmp_path, roomy):
    source = pin(parse_source(f"hf://{REPO}/{FILE}"))
    with pytest.raises(FetchError) as err:
        fetch(source, tmp_path, Progress("x"), sha256="0" * 64)
    assert err.value.reason == "checksum" and err.value.lasting
    assert f"checksum mismatch for {FILE}: sha256 {hub.sha256(hub.repos[REPO][FILE])}, the config says " \
           f"{'0' * 64}" in str(err.value)


def test_a_url_download_that_fails_its_checksum_is_never_put_in_place(hub, tmp_path, roomy):
    url = f"{hub.url}/{REPO}/resolve/main/{FILE}"
    with pytest.raises(FetchError, match="checksum mismatch"):
        fetch(parse_source(url), tmp_path, Progress("x", say=lambda _: None), sha256="0" * 64)
    assert not [p for p in url_dir(tmp_path, url).iterdir()], "a download that failed its checksum was kept"


def test_a_verified_file_is_not_hashed_again_unless_it_changed(tmp_path, gguf_path):
    copy = tmp_path / "m.gguf"
    copy.write_bytes(b"GGUF" + b"\0" * 100)
    good, root = sha256_of(copy), tmp_path / "cache"
    verify_sha256(copy, good, root)
    assert (root / "verified" / good).is_file()
    copy.write_bytes(b"GGUF" + b"\1" * 100)
    with pytest.raises(FetchError, match="checksum mismatch"):
        verify_sha256(copy, good, root)
    assert copy.exists(), "a file outside the cache (the operator's own) is never deleted"


@pytest.mark.parametrize("text, reason", [
    ("hf://test-org/no-such-repo/m.gguf", "not_found"), (f"hf://{REPO}/missing.gguf", "not_found"),
])
def test_hub_not_found(hub, tmp_path, text, reason):
    with pytest.raises(FetchError) as err:
        fetch(parse_source(text), tmp_path, Progress("x"))
    assert err.value.reason == reason and err.value.lasting
    with pytest.raises(FetchError, match="not found|has no file"):
        pin(parse_source(text))


def test_https_not_found(hub, tmp_path):
    with pytest.raises(FetchError) as err:
        fetch(parse_source(f"{hub.url}/{REPO}/resolve/main/nope.gguf"), tmp_path, Progress("x"))
    assert err.value.reason == "not_found"


def test_progress_lines_every_few_seconds_or_tenth():
    now = [0.0]
    said: list[str] = []
    p = Progress("m", every_s=5, every_share=0.1, clock=lambda: now[0], say=said.append)
    p.begin(1000)
    p.advance(50)
    assert len(said) == 1  # only "downloading m (1000 B)"
    p.advance(60)
    assert said[-1] == "downloading m: 110 B of 1000 B (11%)"
    now[0] = 6.0
    p.advance(1)
    assert len(said) == 3 and p.text() == "downloading m: 111 B of 1000 B (11%)"


def test_a_split_model_arrives_whole_from_the_hub_and_from_a_url(tmp_path, roomy, monkeypatch):
    from tests.support.fake_hub import FakeHub

    parts = {}
    for i in (1, 2, 3):
        part = tmp_path / f"p{i}"
        part.write_bytes(b"GGUF" + bytes([i]) * 1000)
        parts[f"Q4_K_M/m-Q4_K_M-{i:05d}-of-00003.gguf"] = part
    with FakeHub({"o/split": parts}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        source = pin(parse_source("o/split:Q4_K_M"))
        assert source.filename == "Q4_K_M/m-Q4_K_M-00001-of-00003.gguf"
        first = fetch(source, tmp_path / "cache", Progress("x", say=lambda _: None))
        assert first.name == "m-Q4_K_M-00001-of-00003.gguf"
        assert sorted(p.name for p in first.parent.iterdir()) == [f"m-Q4_K_M-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
        assert all(hub.gets[("o/split", name)] == 1 for name in parts)
        url = f"{hub.url}/o/split/resolve/main/Q4_K_M/m-Q4_K_M-00001-of-00003.gguf"
        first = fetch(parse_source(url), tmp_path / "cache", Progress("x", say=lambda _: None))
        assert [(first.parent / f"m-Q4_K_M-{i:05d}-of-00003.gguf").read_bytes()[4] for i in (1, 2, 3)] == [1, 2, 3]
