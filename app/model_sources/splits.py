"""Split GGUFs (llama.cpp's gguf-split): `<name>-00001-of-00003.gguf` and its siblings. llama.cpp loads
the model from the first part and finds the others next to it, by name; the metadata is in the first."""

from __future__ import annotations

import re

_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.I)


def split_parts(name: str) -> list[str]:
    """All part names of the split `name` belongs to, first part first; [name] for a whole file."""
    m = _SPLIT.match(name)
    if not m:
        return [name]
    count = int(m["count"])
    return [f"{m['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def is_later_part(name: str) -> bool:
    """A part other than the first (listed with its split, never picked on its own)."""
    m = _SPLIT.match(name)
    return bool(m) and int(m["index"]) != 1
