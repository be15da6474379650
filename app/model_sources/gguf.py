"""Read the key/value metadata of a GGUF file without loading the model.

The builder validates every configured model at `serve run` time (path, format, chat template)
on a CPU node that may never load llama.cpp, so this is plain Python over the documented format:
magic "GGUF", version, tensor count, kv count, then typed key/value pairs. Reading stops at the end
of the key/value section: the tensor infos and data that follow are never touched, so the same
reader works over a remote file object (range reads) with a bound on the bytes it may read.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import IO, Any, BinaryIO

GGUF_MAGIC = b"GGUF"

# GGUF value types (ggml/include/gguf.h).
_SCALARS = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
    10: "<Q", 11: "<q", 12: "<d",
}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """The file is not a readable GGUF model."""


class _Bounded:
    """A file object that refuses to read past `limit` bytes from the start: a remote header whose
    metadata claims more than that fails early instead of fetching a model's worth of data. Skipped
    numeric arrays (a seek) cost nothing; only bytes actually read count."""

    def __init__(self, f: IO[bytes], limit: int) -> None:
        self.f, self.limit = f, limit

    def read(self, n: int) -> bytes:
        if self.f.tell() + n > self.limit:
            raise GGUFError(f"the GGUF metadata is larger than the {self.limit} bytes allowed for a header read")
        return self.f.read(n)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.f.seek(offset, whence)

    def tell(self) -> int:
        return self.f.tell()


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise GGUFError("unexpected end of file in GGUF metadata")
    return struct.unpack(fmt, data)[0]


def _remaining(f: BinaryIO) -> int:
    pos = f.tell()
    end = f.seek(0, 2)
    f.seek(pos)
    return end - pos


def _read_string(f: BinaryIO) -> str:
    n = _read(f, "<Q")
    if n > _remaining(f):  # a corrupt length must not become a huge allocation
        raise GGUFError("unexpected end of file in GGUF string")
    data = f.read(n)
    if len(data) != n:
        raise GGUFError("unexpected end of file in GGUF string")
    return data.decode("utf-8", errors="replace")


def _read_value(f: BinaryIO, vtype: int, keep: bool) -> Any:
    if vtype in _SCALARS:
        return _read(f, _SCALARS[vtype])
    if vtype == _STRING:
        return _read_string(f)
    if vtype == _ARRAY:
        item_type = _read(f, "<I")
        count = _read(f, "<Q")
        if item_type in _SCALARS:
            # Numeric arrays (token scores, types) in one read; skipped unless asked for.
            size = count * struct.calcsize(_SCALARS[item_type])
            if size > _remaining(f):
                raise GGUFError("unexpected end of file in GGUF array")
            if not keep:
                f.seek(size, 1)
                return None
            code = _SCALARS[item_type]
            return list(struct.unpack(f"{code[0]}{count}{code[1]}", f.read(size)))
        if count > _remaining(f):  # every element takes at least one byte
            raise GGUFError("unexpected end of file in GGUF array")
        items = [_read_value(f, item_type, keep) for _ in range(count)]
        return items if keep else None
    raise GGUFError(f"unknown GGUF value type {vtype}")


def read_metadata(source: str | Path | IO[bytes], keep_arrays: tuple[str, ...] = (),
                  max_bytes: int | None = None) -> dict[str, Any]:
    """Return the GGUF key/value metadata of a path or a seekable binary file object (left open).
    Arrays are kept only for keys in `keep_arrays`. `max_bytes`: read no byte past that offset
    (GGUFError if the metadata goes on)."""
    if isinstance(source, (str, Path)):
        with open(source, "rb") as f:
            return _read_all(f, str(source), keep_arrays, max_bytes)
    return _read_all(source, getattr(source, "path", None) or "the file", keep_arrays, max_bytes)


def _read_all(f: IO[bytes], name: str, keep_arrays: tuple[str, ...], max_bytes: int | None) -> dict[str, Any]:
    if max_bytes is not None:
        f = _Bounded(f, max_bytes)  # type: ignore[assignment]
    if f.read(4) != GGUF_MAGIC:
        raise GGUFError(f"{name} is not a GGUF file (bad magic)")
    version = _read(f, "<I")
    if version < 2:
        raise GGUFError(f"{name}: GGUF version {version} is not supported")
    _read(f, "<Q")  # tensor count
    n_kv = _read(f, "<Q")
    meta: dict[str, Any] = {"gguf.version": version}
    for _ in range(n_kv):
        key = _read_string(f)
        vtype = _read(f, "<I")
        value = _read_value(f, vtype, keep=key in keep_arrays)
        if value is not None:
            meta[key] = value
    return meta


def special_token_text(meta: dict[str, Any], tokens: list[str] | None, key: str) -> str:
    """Text of a special token (e.g. `tokenizer.ggml.bos_token_id`), '' when absent."""
    token_id = meta.get(key)
    if tokens is None or token_id is None or not 0 <= token_id < len(tokens):
        return ""
    return tokens[token_id]


# llama.cpp's token types (llama_token_type): CONTROL and UNKNOWN texts become tokens only when a
# text is tokenized with special-token parsing, as template text is and client text is not.
TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_CONTROL = 2, 3


def control_token_texts(meta: dict[str, Any]) -> tuple[str, ...]:
    """Texts of the vocabulary's control (and unknown) tokens, from `tokenizer.ggml.tokens` and
    `tokenizer.ggml.token_type` (both kept by read_metadata); () when the file does not list them."""
    tokens, types = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.token_type")
    if not isinstance(tokens, list) or not isinstance(types, list) or len(tokens) != len(types):
        return ()
    return tuple(sorted({text for text, kind in zip(tokens, types)
                         if kind in (TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_CONTROL) and text}))


def read_tensors(path: str | Path) -> tuple[dict[str, Any], dict[str, tuple[tuple[int, ...], int]]]:
    """A GGUF file's metadata and its tensor table: name -> (shape in ggml's order, ne[0] first; GGML type
    id). Reads the header and the table only, never tensor data (a LoRA adapter checked against its base
    before llama.cpp loads it)."""
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise GGUFError(f"{path} is not a GGUF file (bad magic)")
        version = _read(f, "<I")
        if version < 2:
            raise GGUFError(f"{path}: GGUF version {version} is not supported")
        n_tensors = _read(f, "<Q")
        n_kv = _read(f, "<Q")
        meta: dict[str, Any] = {"gguf.version": version}
        for _ in range(n_kv):
            key = _read_string(f)
            value = _read_value(f, _read(f, "<I"), keep=False)
            if value is not None:
                meta[key] = value
        if n_tensors * 24 > _remaining(f):  # each entry takes at least 24 bytes: a corrupt count
            raise GGUFError(f"{path}: unexpected end of file in the GGUF tensor table")
        tensors: dict[str, tuple[tuple[int, ...], int]] = {}
        for _ in range(n_tensors):
            name = _read_string(f)
            n_dims = _read(f, "<I")
            if n_dims > 4:
                raise GGUFError(f"{path}: tensor {name} has {n_dims} dimensions (GGML has at most 4)")
            shape = tuple(_read(f, "<Q") for _ in range(n_dims))
            ggml_type = _read(f, "<I")
            _read(f, "<Q")  # data offset
            tensors[name] = (shape, ggml_type)
        return meta, tensors
