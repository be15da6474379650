"""The bundled SmolLM2-135M with fill-in-the-middle tokens named in its metadata: the test model of /infill.

SmolLM2's vocabulary has StarCoder's repository tokens (`<repo_name>`, `<file_sep>`, ...) but no
`<fim_prefix>` / `<fim_suffix>` / `<fim_middle>`: llama.cpp finds no FIM prefix, suffix or middle token in it,
and llama-server refuses /infill on it. No small GGUF with FIM tokens is on the package index, so this writes
the bundled GGUF again, tensors byte for byte, with `tokenizer.ggml.fim_*_token_id` naming control tokens it
already has (the keys llama.cpp reads, as a converter writes them for a code model):

    prefix `<issue_start>` (8), suffix `<issue_comment>` (9), middle `<issue_closed>` (10),
    pad `<empty_output>` (16), repository `<reponame>` (4), file separator `<file_sep>` (5).

The model was never trained on that layout: it proves the FIM prompt is built from the GGUF's own tokens and
reaches llama.cpp as llama-server builds it (the same GGUF serves both in the oracle test), not that a 135M chat
model completes code well.

    python -m tools.fim_gguf [--out FILE]     (default: the test-model cache)
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from tools.model_cache import cached_build

VERSION = "1"  # bump when the tokens change: it keys the cache
CACHE_DIR = Path(os.environ.get("LLAMARAY_TEST_MODELS", "~/.cache/llamaray/test-models")).expanduser()

FIM_TOKENS = {"fim_pre": 8, "fim_suf": 9, "fim_mid": 10, "fim_pad": 16, "fim_rep": 4, "fim_sep": 5}


def write_fim(out: str | Path, source: str | Path | None = None) -> Path:
    """`source` (default: the bundled model) written to `out` with FIM_TOKENS in its metadata."""
    import gguf

    from tools.make_lora import bundled_base

    source = Path(source) if source is not None else bundled_base()
    reader = gguf.GGUFReader(str(source))
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    keys = {f"tokenizer.ggml.{name}_token_id": token for name, token in FIM_TOKENS.items()}
    writer = gguf.GGUFWriter(str(out), arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF.") or field.name in keys:
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for key, token in keys.items():
        writer.add_uint32(key, token)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    return Path(out)


def cached_gguf() -> Path:
    """The FIM copy in the test-model cache, keyed by VERSION; built on first use (tools/model_cache.py)."""
    return cached_build(CACHE_DIR, f"smollm2-135m-fim-v{VERSION}.gguf", write_fim)

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.fim_gguf", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None, help="write the GGUF here (default: the test-model cache)")
    ns = p.parse_args(argv)
    print(write_fim(ns.out) if ns.out else cached_gguf())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
