"""A tiny projector GGUF with random weights for the bundled model (SmolLM2-135M, n_embd 576): an
idefics3 (SmolVLM-style) vision encoder of 2 blocks that llama.cpp's mtmd loads and runs, turning each
256x256 slice of an image into 16 embedding rows (mtmd adds an overview: two chunks for a small image).
The rows mean nothing; the tests check the plumbing (positions, counts, cache keys, freeing), not what a
model sees. Under 1 MB, written in well under a second; few rows keep the tests fast on 2 cores."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

LM_EMBD = 576      # SmolLM2-135M's embedding size: the projector's output rows
IMAGE_TOKENS = 16  # rows per chunk: (256 / 16)^2 patches, merged 4x4


def write_tiny_mmproj(path: str | Path, seed: int = 0) -> Path:
    d, ff, blocks, heads, size, patch, merge = 64, 128, 2, 4, 256, 16, 4
    rng = np.random.default_rng(seed)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("general.name", "tiny-random-idefics3-mmproj")
    w.add_string("clip.projector_type", "idefics3")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_text_encoder", False)
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", size)
    w.add_uint32("clip.vision.patch_size", patch)
    w.add_uint32("clip.vision.embedding_length", d)
    w.add_uint32("clip.vision.feed_forward_length", ff)
    w.add_uint32("clip.vision.block_count", blocks)
    w.add_uint32("clip.vision.attention.head_count", heads)
    w.add_uint32("clip.vision.projection_dim", LM_EMBD)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_uint32("clip.vision.projector.scale_factor", merge)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_tensor("v.patch_embd.weight", rand(d, 3, patch, patch).astype(np.float16))
    w.add_tensor("v.patch_embd.bias", rand(d))
    w.add_tensor("v.position_embd.weight", rand((size // patch) ** 2, d))
    for i in range(blocks):
        for name, shape in (("attn_q", (d, d)), ("attn_k", (d, d)), ("attn_v", (d, d)), ("attn_out", (d, d)),
                            ("ffn_up", (ff, d)), ("ffn_down", (d, ff))):
            w.add_tensor(f"v.blk.{i}.{name}.weight", rand(*shape))
            w.add_tensor(f"v.blk.{i}.{name}.bias", rand(shape[0]))
        for name in ("ln1", "ln2"):
            w.add_tensor(f"v.blk.{i}.{name}.weight", np.ones(d, np.float32))
            w.add_tensor(f"v.blk.{i}.{name}.bias", np.zeros(d, np.float32))
    w.add_tensor("v.post_ln.weight", np.ones(d, np.float32))
    w.add_tensor("v.post_ln.bias", np.zeros(d, np.float32))
    w.add_tensor("mm.model.fc.weight", rand(LM_EMBD, d * merge * merge))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
