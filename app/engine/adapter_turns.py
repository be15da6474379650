"""An engine's LoRA adapters and whose turn it is on the context.

llama.cpp applies adapters to the whole context (lora.py), so a step decodes only the sequences of one adapter
set, the one on the context: while one set has work it keeps the context; when several do, each set holds it for
ADAPTER_TURN_STEPS steps at most, then the set that has waited longest since its last turn takes it (round robin:
none starves, and a switch, which makes llama.cpp reserve its graph again, costs one per turn rather than one per
step). Slots and the prompt cache reuse KV only within one adapter set (Generation.kv_scope).

Adapters are loaded by name from any thread; an unloaded one is retired and freed on the decode thread once no
queued, admitted or running generation holds it. `lock` is the engine's (it guards the engine's queue too)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from ..kvstore.key import file_sha256
from . import lora
from .lora import BASE, AdapterSet, LoraAdapter
from .slots import Slot, SlotState

log = logging.getLogger("llamaray.engine")

# Steps one adapter set decodes before another set with work takes the context. A switch made the next
# step take about twice as long on the bundled model (llama.cpp reserves its graph again: 14 ms against 7).
ADAPTER_TURN_STEPS = 4


class AdapterTurns:
    def __init__(self, spec: Any, llama: Any, lock: threading.Condition) -> None:
        self.spec = spec
        self.llama = llama
        self.lock = lock
        self.loaded: dict[str, LoraAdapter] = {}
        self.retired: list[LoraAdapter] = []
        self._base_tensors: lora.BaseTensors | None = None
        self.on_context: AdapterSet = BASE  # the set llama.cpp applies now (decode thread)
        self._turn_steps = 0                # steps the set on the context has had in its turn
        self._last_turn: dict[AdapterSet, int] = {}  # set -> the step its last turn began
        self.switches = 0

    # -- any thread -----------------------------------------------------------------------------------------------
    def load(self, name: str, path: str, closing: Any) -> LoraAdapter:
        """Load the LoRA adapter GGUF at `path` as `name`, checked against the model first (lora.AdapterMismatch,
        nothing loaded, for an adapter made for another base); a ValueError for a name already loaded, or when the
        engine is closing (`closing()`). Slow (reads the file)."""
        if not name:
            raise ValueError("an adapter needs a name")
        with self.lock:
            if name in self.loaded:
                raise ValueError(f"model `{self.spec.id}` already has an adapter named `{name}`")
        if self._base_tensors is None:
            self._base_tensors = lora.BaseTensors.read(self.spec.id, self.spec.path)
        adapter = lora.load_adapter(self.llama, self._base_tensors, name, path)
        adapter.content = file_sha256(path)
        with self.lock:
            if name not in self.loaded and not closing():
                self.loaded[name] = adapter
                log.info("model %s: adapter %s loaded from %s", self.spec.id, name, path)
                return adapter
            refused = closing()
        adapter.free()  # never set on the context: free here
        raise ValueError("the engine is closing" if refused else
                         f"model `{self.spec.id}` already has an adapter named `{name}`")

    def unload(self, name: str) -> bool:
        """Stop accepting requests for adapter `name` (False: none loaded); it is freed on the decode thread once
        no generation uses it."""
        with self.lock:
            adapter = self.loaded.pop(name, None)
            if adapter is None:
                return False
            self.retired.append(adapter)
            self.lock.notify()
        return True

    def names(self) -> list[str]:
        with self.lock:
            return sorted(self.loaded)

    def resolve(self, requested: Iterable[tuple[str, float]]) -> AdapterSet:
        """The adapter set a request names ((name, scale) pairs); an engine error for one not loaded."""
        return lora.resolve(self.spec.id, self.loaded, requested) if requested else BASE

    def gone(self, adapters: AdapterSet) -> LoraAdapter | None:
        """Under the lock: an adapter of `adapters` unloaded since the request was prepared, if any."""
        return next((a for a in adapters.adapters if self.loaded.get(a.name) is not a), None)

    # -- the decode thread ----------------------------------------------------------------------------------------
    def unused_retired(self, holders: Iterable[Any]) -> list[LoraAdapter]:
        """Under the lock: retired adapters that no generation of `holders` (queued, admitted, running) holds, out
        of the retired list."""
        if not self.retired:
            return []
        held = {id(a) for g in holders for a in g.adapters.adapters}
        unused = [a for a in self.retired if id(a) not in held]
        self.retired = [a for a in self.retired if id(a) in held]
        return unused

    def free(self, adapters: list[LoraAdapter]) -> None:
        """Free llama.cpp's adapters, first taking them off the context if it applies them."""
        if not adapters:
            return
        if any(a in self.on_context.adapters for a in adapters):
            lora.apply(self.llama, BASE)
            self.on_context = BASE
        for adapter in adapters:
            adapter.free()
            log.info("model %s: adapter %s freed", self.spec.id, adapter.name)

    def free_all(self) -> None:
        """Every adapter freed (the engine is closing and its thread is done)."""
        self.free([*self.loaded.values(), *self.retired])
        self.loaded, self.retired = {}, []

    def in_turn(self, slot: Slot) -> bool:
        """Whether `slot` decodes this step: its generation's adapter set is the one on the context."""
        return slot.gen is not None and slot.gen.adapters == self.on_context

    def take_turn(self, slots: list[Slot], step: int) -> None:
        """Put on the context the adapter set this step decodes. The set on the context keeps it while it alone has
        work, or for ADAPTER_TURN_STEPS steps when others wait; then the set whose last turn began longest ago
        (never: first, oldest request first) takes it."""
        current = self.on_context
        oldest: dict[AdapterSet, float] = {}
        for slot in slots:
            if slot.gen is not None and slot.state in (SlotState.PREFILLING, SlotState.GENERATING):
                aset = slot.gen.adapters
                oldest[aset] = min(oldest.get(aset, slot.gen.queued_at), slot.gen.queued_at)
        self._turn_steps += 1
        if not oldest or (current in oldest and (len(oldest) == 1 or self._turn_steps <= ADAPTER_TURN_STEPS)):
            return
        waiting = [aset for aset in oldest if aset != current]
        nxt = min(waiting, key=lambda aset: (self._last_turn.get(aset, -1), oldest[aset]))
        lora.apply(self.llama, nxt)
        self.on_context = nxt
        self._turn_steps = 1
        self._last_turn = {aset: self._last_turn[aset] for aset in oldest if aset in self._last_turn}
        self._last_turn[nxt] = step
        self.switches += 1
