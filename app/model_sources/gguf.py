"""Read the key/value metadata of a GGUF file without loading the model.

The builder validates every configured model at `serve run` time (path, format, chat template)
on a CPU node that may never load llama.cpp, so this is plain Python over the documented format:
magic "GGUF", version, tensor count, kv count, then typed key/value pairs. Reading stops at the end
of the key/value section: the tensor infos and data that follow are never touched, so the same
reader works over a remote file object (range reads) with a bound on the bytes it may read.
"""

from __future__ import annotations

import functools
import struct
from pathlib import Path
from typing import IO, Any

GGUF_MAGIC = b"GGUF"

# GGUF value types (ggml/include/gguf.h).
_SCALARS = {vtype: struct.Struct(code) for vtype, code in {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
    10: "<Q", 11: "<q", 12: "<d",
}.items()}
_U32, _U64 = _SCALARS[4], _SCALARS[10]
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """The file is not a readable GGUF model."""


class _Reader:
    """A GGUF file read front to back, its position and length kept here: a vocabulary holds ~10^5 strings, and
    asking the file object for its length at each one (a seek to the end and back) was most of a read's time.
    `limit`: no byte is read past that offset, so a remote header whose metadata claims more fails early instead
    of fetching a model's worth of data; skipped numeric arrays (a seek) cost nothing, only bytes actually read
    count."""

    def __init__(self, f: IO[bytes], limit: int | None = None) -> None:
        self.f, self.limit = f, limit
        self.pos = f.tell()
        self.end = f.seek(0, 2)
        f.seek(self.pos)

    def take(self, n: int, what: str = "metadata") -> bytes:
        if self.limit is not None and self.pos + n > self.limit:
            raise GGUFError(f"the GGUF metadata is larger than the {self.limit} bytes allowed for a header read")
        data = self.f.read(n)
        if len(data) != n:
            raise GGUFError(f"unexpected end of file in GGUF {what}")
        self.pos += n
        return data

    def skip(self, n: int) -> None:
        self.f.seek(n, 1)
        self.pos += n

    def remaining(self) -> int:
        return self.end - self.pos

    def scalar(self, code: struct.Struct) -> Any:
        return code.unpack(self.take(code.size))[0]

    def string(self, keep: bool = True) -> str | None:
        n = _U64.unpack(self.take(8))[0]
        if n > self.end - self.pos:  # a corrupt length must not become a huge allocation
            raise GGUFError("unexpected end of file in GGUF string")
        data = self.take(n, "string")
        return data.decode("utf-8", errors="replace") if keep else None

    def value(self, vtype: int, keep: bool) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise GGUFError(f"unknown GGUF value type {vtype}")
        item_type = self.scalar(_U32)
        count = self.scalar(_U64)
        if item_type in _SCALARS:
            # Numeric arrays (token scores, types) in one read; skipped unless asked for.
            code = _SCALARS[item_type]
            size = count * code.size
            if size > self.remaining():
                raise GGUFError("unexpected end of file in GGUF array")
            if not keep:
                self.skip(size)
                return None
            return list(struct.unpack(f"{code.format[0]}{count}{code.format[1:]}", self.take(size)))
        if count > self.remaining():  # every element takes at least one byte
            raise GGUFError("unexpected end of file in GGUF array")
        if item_type == _STRING:  # a vocabulary or merges: the hot loop of a read
            items = [self.string(keep) for _ in range(count)]
        else:
            items = [self.value(item_type, keep) for _ in range(count)]
        return items if keep else None

    def header(self, name: str) -> tuple[int, int, int]:
        """(version, tensor count, key/value count) after the magic."""
        if self.f.read(4) != GGUF_MAGIC:
            raise GGUFError(f"{name} is not a GGUF file (bad magic)")
        self.pos += 4
        version = self.scalar(_U32)
        if version < 2:
            raise GGUFError(f"{name}: GGUF version {version} is not supported")
        return version, self.scalar(_U64), self.scalar(_U64)

    def pairs(self, version: int, n_kv: int, keep_arrays: tuple[str, ...]) -> dict[str, Any]:
        meta: dict[str, Any] = {"gguf.version": version}
        for _ in range(n_kv):
            key = self.string()
            value = self.value(self.scalar(_U32), keep=key in keep_arrays)
            if value is not None:
                meta[key] = value
        return meta


def read_metadata(source: str | Path | IO[bytes], keep_arrays: tuple[str, ...] = (),
                  max_bytes: int | None = None) -> dict[str, Any]:
    """Return the GGUF key/value metadata of a path or a seekable binary file object (left open).
    Arrays are kept only for keys in `keep_arrays`. `max_bytes`: read no byte past that offset
    (GGUFError if the metadata goes on)."""
    if isinstance(source, (str, Path)):
        st = Path(source).stat()
        # A copy: callers may add to it. The arrays in it are shared and read only.
        version = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        return dict(_read_path(str(source), version, tuple(keep_arrays), max_bytes))
    return _read_all(source, getattr(source, "path", None) or "the file", keep_arrays, max_bytes)


@functools.lru_cache(maxsize=8)
def _read_path(path: str, _version: tuple[int, ...], keep_arrays: tuple[str, ...],
               max_bytes: int | None) -> dict[str, Any]:
    """One read per version of a file: checking a config reads each model's metadata more than once (its
    template, its memory), and a pool may name the same file many times."""
    with open(path, "rb") as f:
        return _read_all(f, path, keep_arrays, max_bytes)


def _read_all(f: IO[bytes], name: str, keep_arrays: tuple[str, ...], max_bytes: int | None) -> dict[str, Any]:
    reader = _Reader(f, max_bytes)
    version, _n_tensors, n_kv = reader.header(name)
    return reader.pairs(version, n_kv, keep_arrays)


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
        reader = _Reader(f)
        version, n_tensors, n_kv = reader.header(str(path))
        meta = reader.pairs(version, n_kv, ())
        if n_tensors * 24 > reader.remaining():  # each entry takes at least 24 bytes: a corrupt count
            raise GGUFError(f"{path}: unexpected end of file in the GGUF tensor table")
        tensors: dict[str, tuple[tuple[int, ...], int]] = {}
        for _ in range(n_tensors):
            name = reader.string()
            n_dims = reader.scalar(_U32)
            if n_dims > 4:
                raise GGUFError(f"{path}: tensor {name} has {n_dims} dimensions (GGML has at most 4)")
            shape = tuple(reader.scalar(_U64) for _ in range(n_dims))
            ggml_type = reader.scalar(_U32)
            reader.scalar(_U64)  # data offset
            tensors[name] = (shape, ggml_type)
        return meta, tensors
