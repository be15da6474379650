"""tools/early_exit_gguf.py: a draft for speculative decoding cut from the bundled model loads in llama.cpp,
shares its target's vocabulary, and holds only its first blocks."""

from __future__ import annotations

import llama_cpp as L
import pytest

from app.engine.llama import LlamaModelContext, greedy_token
from app.model_sources.gguf import read_tensors
from tools.early_exit_gguf import write_early_exit
from tools.make_lora import bundled_base


def load(path):
    return LlamaModelContext(str(path), n_ctx_per_seq=128, n_seq_max=1, n_batch=64, n_threads=1, n_threads_batch=1,
                             n_gpu_layers=0, kv_unified=True)


def test_the_draft_is_the_targets_first_blocks_with_its_head_and_vocabulary(tmp_path):
    draft = write_early_exit(tmp_path / "draft.gguf", layers=6)
    meta, tensors = read_tensors(draft)
    base_meta, base_tensors = read_tensors(bundled_base())
    assert meta["llama.block_count"] == 6 and base_meta["llama.block_count"] == 30
    assert {n for n in tensors if n.startswith("blk.")} == {n for n in base_tensors
                                                          if n.startswith("blk.") and int(n.split(".")[1]) < 6}
    assert {n: base_tensors[n] for n in tensors} == tensors  # shapes and quantization as the target's
    assert "6 of 30" in meta["general.name"]
    target, small = load(bundled_base()), load(draft)
    try:
        assert L.llama_vocab_n_tokens(small.vocab) == L.llama_vocab_n_tokens(target.vocab)
        text = "def add(a, b):\n    return"
        assert small.tokenize(text) == target.tokenize(text)
        assert 0 <= greedy_token(small, small.tokenize(text)) < L.llama_vocab_n_tokens(small.vocab)
    finally:
        target.close()
        small.close()


@pytest.mark.parametrize("layers", [0, 31])
def test_a_draft_needs_between_one_block_and_all_of_them(tmp_path, layers):
    with pytest.raises(ValueError, match="1 to 30"):
        write_early_exit(tmp_path / "draft.gguf", layers=layers)
