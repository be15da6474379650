"""A draft model for speculative decoding, cut from a GGUF: its first N transformer blocks, then its own final
norm and output head (self-speculation by early exit).

Only the bundled SmolLM2-135M exists as a real GGUF here; a draft must share its target's vocabulary, so the
tests and `bench.spec` make one from the target itself. Every tensor is copied byte for byte (quantized ones
stay quantized); the metadata is the source's with `<arch>.block_count` = N and a new `general.name`. The
draft is cheaper per token by about N / n_layer of the blocks' share and agrees with the target where the
early layers already decide the next token (copying, boilerplate), which is what speculation needs.

    python tools/early_exit_gguf.py --out draft.gguf [--layers 10] [--source MODEL.gguf]
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

BLOCK = re.compile(r"^blk\.(\d+)\.")


def write_early_exit(out: str | Path, source: str | Path | None = None, *, layers: int = 10) -> Path:
    """Write the first `layers` blocks of `source` (default: the bundled model) with its head to `out`."""
    import gguf

    from tools.make_lora import bundled_base

    source = Path(source) if source is not None else bundled_base()
    reader = gguf.GGUFReader(str(source))
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    count_key = gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)
    n_layer = reader.get_field(count_key).contents()
    if not 1 <= layers <= n_layer:
        raise ValueError(f"{source.name} has {n_layer} blocks; a draft takes 1 to {n_layer}, not {layers}")
    name = reader.get_field(gguf.Keys.General.NAME)
    writer = gguf.GGUFWriter(str(out), arch)
    for field in reader.fields.values():
        # The architecture and GGUF.* fields are the writer's own; the name and block count are replaced.
        if field.name in (gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.NAME, count_key) \
                or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    writer.add_name(f"{name.contents() if name else source.stem} (first {layers} of {n_layer} blocks)")
    writer.add_uint32(count_key, layers)
    kept = [t for t in reader.tensors if not (m := BLOCK.match(t.name)) or int(m.group(1)) < layers]
    for t in kept:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in kept:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    return Path(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tools/early_exit_gguf.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--source", type=Path, default=None, help="the target GGUF (default: the bundled model)")
    p.add_argument("--layers", type=int, default=10, help="blocks kept, from the first")
    ns = p.parse_args(argv)
    print(write_early_exit(ns.out, ns.source, layers=ns.layers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
