"""The builder reads a remote GGUF's header by range reads, within a bound, and never fetches the file."""

from __future__ import annotations

import pytest

from app.model_sources.gguf import GGUFError, read_metadata
from app.config.resolution import KEPT_ARRAYS, resolve_model
from app.config.schema import ConfigError, ModelConfig
from tests.support.fake_hub import COMMIT, FILE, REPO

META_END = 1_769_507  # where the bundled model's key/value section ends (tests/config/test_gguf.py)


class Watched:
    """A file object that remembers the furthest byte read from it."""

    def __init__(self, f):
        self.f, self.furthest = f, 0

    def read(self, n=-1):
        data = self.f.read(n)
        self.furthest = max(self.furthest, self.f.tell())
        return data

    def seek(self, *args):
        return self.f.seek(*args)

    def tell(self):
        return self.f.tell()


def test_header_from_a_file_object_stops_at_the_end_of_the_key_values(gguf_path):
    with open(gguf_path, "rb") as f:
        watched = Watched(f)
        meta = read_metadata(watched, keep_arrays=KEPT_ARRAYS, max_bytes=META_END)
    assert len(meta["tokenizer.ggml.tokens"]) == 49152 and "tokenizer.chat_template" in meta
    assert watched.furthest <= META_END
    assert meta == read_metadata(gguf_path, keep_arrays=KEPT_ARRAYS)


def test_header_read_refuses_to_go_past_its_bound(gguf_path):
    with open(gguf_path, "rb") as f:
        watched = Watched(f)
        with pytest.raises(GGUFError, match="larger than the 100000 bytes allowed"):
            read_metadata(watched, keep_arrays=KEPT_ARRAYS, max_bytes=100_000)
    assert watched.furthest <= 100_000


def test_the_builder_reads_only_the_header_of_a_hub_model(hub, gguf_path, monkeypatch, tmp_path):
    monkeypatch.setenv("LLAMARAY_MODEL_CACHE", str(tmp_path))
    local = resolve_model(ModelConfig(id="m", model_path=str(gguf_path)))
    remote = resolve_model(ModelConfig(id="m", model_path=f"{REPO}:Q4_1", sha256="a" * 64))
    assert remote.path == "" and remote.source == f"hf://{REPO}/{FILE}@{COMMIT}" and remote.sha256 == "a" * 64
    assert remote.metadata_from == "header" and not remote.metadata_note
    for field in ("chat_template", "bos_token", "eos_token", "n_vocab", "control_tokens"):
        assert getattr(remote, field) == getattr(local, field), field
    assert hub.gets[(REPO, FILE)] == 0
    assert 0 < hub.range_bytes[(REPO, FILE)] < 8 << 20 < gguf_path.stat().st_size
    assert not list(tmp_path.iterdir()), "the builder wrote to the model cache"


def test_an_unreadable_header_needs_a_configured_template(hub):
    with pytest.raises(ConfigError, match=r"cannot read the GGUF header of 'hf://test-org/nope/m.gguf'.*"
                                          r"set `chat_template`"):
        resolve_model(ModelConfig(id="m", model_path="hf://test-org/nope/m.gguf"))
    spec = resolve_model(ModelConfig(id="m", model_path="hf://test-org/nope/m.gguf", chat_template="{{ x }}"))
    assert spec.metadata_from == "config" and "not found" in spec.metadata_note
    assert spec.source == "hf://test-org/nope/m.gguf" and spec.chat_template == "{{ x }}"


def test_a_quant_that_is_not_there_fails_the_build_listing_the_quants(hub):
    with pytest.raises(ConfigError, match=r"has no GGUF quantized as 'Q4_K_M'; available: Q4_1"):
        resolve_model(ModelConfig(id="m", model_path=f"{REPO}:Q4_K_M", chat_template="{{ x }}"))
