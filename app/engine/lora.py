"""LoRA adapters on a loaded model: checked against the base, loaded, set on the context, freed once.

llama.cpp loads an adapter for a model (`llama_adapter_lora_init`) and applies adapters per context, not
per sequence (`llama_set_adapters_lora`): every sequence of a decode runs under the adapter set on the
context. So a generation's adapters are an `AdapterSet` (hashable: the engine groups sequences by it and
decodes one set per step, engine.py) and KV computed under one set is never reused under another
(`AdapterSet.scope`).

An adapter is checked before llama.cpp sees it (`check_adapter`): its GGUF's type, architecture and the
shape of every tensor pair against the base model's tensor table, so an adapter made for another base is
refused with a message naming both (llama.cpp would only log its reason and return NULL). Only this
module (besides llama.py and vision.py) touches llama.cpp through ctypes.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp as L

from .errors import EngineError, bad_input, not_found
from ..model_sources.gguf import GGUFError, read_tensors
from ..model_sources.splits import split_parts
from .llama import LlamaModelContext

# Tensor types an adapter may hold (what convert_lora_to_gguf.py writes): F32, F16, Q8_0, BF16, with
# the elements per block a row's length must divide (llama.cpp's matmul asserts on a ragged row).
ADAPTER_TYPES = {0: ("F32", 1), 1: ("F16", 1), 8: ("Q8_0", 32), 30: ("BF16", 1)}

_uids = itertools.count(1)
_uid_lock = threading.Lock()


class AdapterMismatch(ValueError):
    """An adapter that does not fit the model it was offered to; the message names both."""


def unknown_adapter(model_id: str, name: str) -> EngineError:
    return not_found(f"Model `{model_id}` has no adapter `{name}` loaded.", "model", "model_not_found")


@dataclass(frozen=True)
class BaseTensors:
    """What an adapter is checked against: the base model's architecture and tensor shapes (ggml order)."""

    model_id: str
    path: str
    arch: str
    shapes: dict[str, tuple[int, ...]]

    @classmethod
    def read(cls, model_id: str, path: str) -> "BaseTensors":
        meta, tensors = read_tensors(path)
        shapes = {name: shape for name, (shape, _) in tensors.items()}
        first = Path(path)
        for part in split_parts(first.name)[1:]:  # a split model's other parts hold the rest of its tensors
            shapes.update({name: shape for name, (shape, _) in read_tensors(first.with_name(part))[1].items()})
        return cls(model_id, path, str(meta.get("general.architecture", "")), shapes)


def check_adapter(name: str, path: str, base: BaseTensors) -> float:
    """Raise AdapterMismatch unless the GGUF at `path` is a LoRA adapter llama.cpp can apply to `base`
    (the checks of llama_adapter_lora_init, done first so the refusal can say why); its alpha otherwise."""
    label = f"Adapter `{name}` ({path})"
    try:
        meta, tensors = read_tensors(path)
    except (OSError, GGUFError) as exc:
        raise AdapterMismatch(f"{label} cannot be read: {exc}") from None
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise AdapterMismatch(f"{label} is not a LoRA adapter (general.type {meta.get('general.type')!r}, "
                              f"adapter.type {meta.get('adapter.type')!r}; expected 'adapter' and 'lora').")
    arch = meta.get("general.architecture")
    if arch != base.arch:
        raise AdapterMismatch(f"{label} was made for a `{arch}` model; model `{base.model_id}` ({base.path}) is "
                              f"`{base.arch}`.")
    if "adapter.alora.invocation_tokens" in meta:
        raise AdapterMismatch(f"{label} is an activated LoRA (aLoRA), which this server does not apply.")
    pairs: dict[str, dict[str, tuple[tuple[int, ...], int]]] = {}
    for tname, info in tensors.items():
        for suffix in (".lora_a", ".lora_b"):
            if tname.endswith(suffix):
                pairs.setdefault(tname[:-len(suffix)], {})[suffix] = info
                break
        else:
            if not tname.endswith("_norm.weight"):  # llama.cpp skips norm vectors, refuses anything else
                raise AdapterMismatch(f"{label} holds tensor `{tname}`, which is no LoRA pair (.lora_a/.lora_b).")
    if not pairs:
        raise AdapterMismatch(f"{label} holds no LoRA tensors.")
    for target, pair in sorted(pairs.items()):
        if len(pair) != 2:
            raise AdapterMismatch(f"{label}: tensor `{target}` has only one of its .lora_a/.lora_b pair.")
        (a, a_type), (b, b_type) = pair[".lora_a"], pair[".lora_b"]
        if target not in base.shapes:
            raise AdapterMismatch(f"{label} adapts tensor `{target}`, which model `{base.model_id}` ({base.path}, "
                                  f"`{base.arch}`) does not have: it was made for another base model.")
        for t, shape, suffix in ((a_type, a, "lora_a"), (b_type, b, "lora_b")):
            if t not in ADAPTER_TYPES or len(shape) != 2 or shape[0] % ADAPTER_TYPES[t][1]:
                raise AdapterMismatch(f"{label}: `{target}.{suffix}` (GGML type {t}, shape {list(shape)}) is not a "
                                      f"2-D {'/'.join(n for n, _ in ADAPTER_TYPES.values())} tensor.")
        w = base.shapes[target]
        if len(w) != 2:
            raise AdapterMismatch(f"{label} adapts `{target}`, a {len(w)}-D tensor of model `{base.model_id}`.")
        # llama.cpp's shape rules (ne order): W [n_in, n_out], A [n_in, r], B [r, n_out]; token_embd's pair is flipped.
        if target.endswith("token_embd.weight"):
            fits = w[0] == b[1] and w[1] == a[1]
        else:
            fits = w[0] == a[0] and w[1] == b[1] and a[1] == b[0]
        if not fits:
            raise AdapterMismatch(
                f"{label} does not fit model `{base.model_id}` ({base.path}, `{base.arch}`): its `{target}` pair has "
                f"shapes A {list(a)}, B {list(b)} while the model's `{target}` is {list(w)}: it was made for "
                f"another base model.")
    alpha = meta.get("adapter.lora.alpha", 0.0)
    return float(alpha) if isinstance(alpha, (int, float)) and math.isfinite(alpha) else 0.0


@dataclass(eq=False)
class LoraAdapter:
    """One adapter loaded for one model. Identity is the adapter: two loads of one file are two adapters
    (the KV each computed is its own). Freed exactly once, before its model (`free`)."""

    name: str
    path: str
    alpha: float
    uid: int
    _ptr: Any
    content: str = ""  # the adapter file's sha256, which keys the KV stored beyond the replica (kv_tiers.py)

    @property
    def loaded(self) -> bool:
        return self._ptr is not None

    def free(self) -> None:
        """Free llama.cpp's adapter; the caller has taken it off every context first. Idempotent."""
        if self._ptr is not None:
            L.llama_adapter_lora_free(self._ptr)
            self._ptr = None

    def __repr__(self) -> str:
        return f"LoraAdapter({self.name!r}, uid={self.uid})"


def load_adapter(llama: LlamaModelContext, base: BaseTensors, name: str, path: str) -> LoraAdapter:
    """Check and load the adapter at `path` for `llama`'s model. AdapterMismatch: refused (nothing
    loaded); RuntimeError: llama.cpp could not load it after the checks passed (its log says why)."""
    alpha = check_adapter(name, path, base)
    ptr = L.llama_adapter_lora_init(llama.model, str(path).encode())
    if not ptr:
        raise RuntimeError(f"llama.cpp could not load adapter `{name}` ({path}) for model `{base.model_id}`")
    with _uid_lock:
        uid = next(_uids)
    return LoraAdapter(name, str(path), alpha, uid, ptr)


@dataclass(frozen=True)
class AdapterSet:
    """The adapters a generation runs under, with their scales: hashable, in one canonical order (by load),
    zero scales left out (llama.cpp leaves them out of the graph too, so such a set IS the base model and
    batches with it). The empty set is the base model."""

    items: tuple[tuple[LoraAdapter, float], ...] = ()

    @classmethod
    def of(cls, pairs: Iterable[tuple[LoraAdapter, float]]) -> "AdapterSet":
        kept = sorted(((a, float(s)) for a, s in pairs if s != 0.0), key=lambda p: p[0].uid)
        return cls(tuple(kept))

    def __bool__(self) -> bool:
        return bool(self.items)

    @property
    def adapters(self) -> tuple[LoraAdapter, ...]:
        return tuple(a for a, _ in self.items)

    @property
    def named(self) -> tuple[tuple[str, float], ...]:
        """(name, scale) pairs: what logs, metrics and stats show."""
        return tuple((a.name, s) for a, s in self.items)

    @property
    def contents(self) -> tuple[tuple[str, float], ...]:
        """(file sha256, scale) pairs: what the KV kept beyond the replica is keyed by."""
        return tuple((a.content or f"{a.name}@{a.path}", s) for a, s in self.items)

    def scope(self, cache_scope: str) -> str:
        """The KV scope of a prompt of `cache_scope` decoded under this set: prefixes are reused (slots, prompt
        cache) only within one scope, so never across adapter sets. The base set leaves the scope as it is."""
        if not self.items:
            return cache_scope
        return cache_scope + "\x1flora:" + ",".join(f"{a.uid}*{s!r}" for a, s in self.items)


BASE = AdapterSet()


def apply(llama: LlamaModelContext, adapters: AdapterSet) -> None:
    """Make `adapters` the context's adapter set (the empty set: the base model). The next decode runs
    under it; llama.cpp reserves its graph again after a change."""
    n = len(adapters.items)
    ptrs = (L.llama_adapter_lora_p_ctypes * max(1, n))(*(a._ptr for a in adapters.adapters))
    scales = (ctypes.c_float * max(1, n))(*(s for _, s in adapters.items))
    rc = L.llama_set_adapters_lora(llama.ctx, ptrs, n, scales)
    if rc != 0:
        raise RuntimeError(f"llama_set_adapters_lora returned {rc}")


def resolve(model_id: str, loaded: dict[str, LoraAdapter], requested: Iterable[tuple[str, float]]) -> AdapterSet:
    """A request's (name, scale) pairs as an AdapterSet of `loaded` adapters; an engine error for a name not
    loaded (not found), a scale that is not a finite number or a name given twice (bad input)."""
    pairs: list[tuple[LoraAdapter, float]] = []
    seen: set[str] = set()
    for i, (name, scale) in enumerate(requested):
        if name in seen:
            raise bad_input(f"Adapter `{name}` is named twice.", f"lora[{i}]", "invalid_value")
        seen.add(name)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise bad_input(f"The scale of adapter `{name}` must be a finite number.", f"lora[{i}]", "invalid_value")
        adapter = loaded.get(name)
        if adapter is None:
            raise unknown_adapter(model_id, name)
        pairs.append((adapter, float(scale)))
    return AdapterSet.of(pairs)
