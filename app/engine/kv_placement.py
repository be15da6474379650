"""Where a prompt goes in the KV: which idle slot takes it, what of it is already there (kept in the slot, copied from
another slot, or restored from the prompt cache), and what a slot held goes to the prompt cache before it is
overwritten. The decode thread's alone: every KV edit of placement happens between steps.

The slot is the lowest-numbered idle one, so busy slots stay packed: with a KV stream per slot, llama.cpp decodes
only runs of consecutive sequence ids together, and 8 decoding sequences spread over 16 slots took twice as long a
step as 8 packed ones. An idle slot already holding a real prefix (MIN_COPY_TOKENS more) is taken instead:
recomputing or copying that prefix costs more than a gap. At least the last prompt token is always recomputed, so
there are logits to sample from. Only KV computed in the prompt's cache scope is reused (kept, copied or
restored): other scopes' prefixes count as nothing. A prefix never ends inside one of the prompt's images."""

from __future__ import annotations

from typing import Any

from .prompt_cache import Entry, PromptCache
from .slots import Slot, SlotState, common_prefix
from .vision import ImageSpan, image_boundary

MIN_COPY_TOKENS = 16


class KVPlacement:
    def __init__(self, llama: Any, slots: list[Slot], prompt_cache: PromptCache, kv_unified: bool) -> None:
        self.llama = llama
        self.slots = slots
        self.prompt_cache = prompt_cache
        self.kv_unified = kv_unified
        # Slots left idle with their KV since the engine last had nothing to do: it goes to the prompt cache then,
        # so the next request's admission (which would save it first, before overwriting) finds it saved.
        self.idle_kv: list[int] = []

    def place(self, prompt: list[int], scope: str, reuse: bool = True,
              images: list[ImageSpan] | None = None) -> tuple[Slot, int]:
        """An idle slot for `prompt`, its KV holding the longest reusable prefix; (slot, tokens kept). The slot's own
        prefix is kept; a longer one is copied in from another slot (a busy slot's earlier positions never change)
        or restored from the prompt cache in host memory, after what the slot held went to that cache."""
        images = images or []
        prefix = {slot.index: image_boundary(common_prefix(slot.tokens, prompt), images)
                  if reuse and slot.scope == scope else 0 for slot in self.slots}
        target = self.lowest_idle()
        best_idle = max((s for s in self.slots if s.state is SlotState.IDLE), key=lambda s: prefix[s.index])
        if prefix[best_idle.index] - prefix[target.index] >= MIN_COPY_TOKENS:
            target = best_idle
        source = max(self.slots, key=lambda s: (prefix[s.index], s is target))
        if prefix[source.index] - prefix[target.index] < MIN_COPY_TOKENS:
            source = target  # copying a stream is only worth it for a real prefix
        cached, held = self.prompt_cache.best(prompt, scope) if reuse else (None, 0)
        held = image_boundary(held, images)
        if cached is not None and held - prefix[source.index] >= MIN_COPY_TOKENS:
            self.save(target, keep=0)
            kept = self._restore(target.index, cached, min(held, len(prompt) - 1))
            if kept:
                return target, kept
            target.tokens = []  # a refused restore leaves the slot's KV empty
            if source is target:
                return target, 0
        keep = min(prefix[source.index], len(prompt) - 1)
        self.save(target, keep=keep if source is target else 0)
        return target, self.keep_prefix(target.index, source.index, keep)

    def lowest_idle(self) -> Slot:
        return next(slot for slot in self.slots if slot.state is SlotState.IDLE)

    def save(self, slot: Slot, keep: int) -> None:
        """Before `slot`'s KV past `keep` tokens is overwritten: store it in the prompt cache."""
        if len(slot.tokens) - keep >= MIN_COPY_TOKENS and self.prompt_cache.worth_keeping(slot.tokens, slot.scope):
            state, size = self.llama.seq_state(slot.index)
            if size:
                self.prompt_cache.put(slot.tokens, state, size, slot.scope)

    def finished(self, slot: Slot) -> None:
        """`slot`'s request left it with its KV: saved while the engine has nothing else to do (save_idle)."""
        if len(slot.tokens) >= MIN_COPY_TOKENS and slot.index not in self.idle_kv:
            self.idle_kv.append(slot.index)

    def save_idle(self, waiting: bool) -> None:
        """One idle slot's KV into the prompt cache while no request waits or runs (one slot a turn of the loop, so
        a request that comes meanwhile waits for one save at most, as it would at its admission)."""
        slot = self.slots[self.idle_kv.pop()]
        if slot.state is SlotState.IDLE and not waiting:
            self.save(slot, keep=0)

    def _restore(self, slot: int, entry: Entry, keep: int) -> int:
        """`entry`'s KV into `slot`, cut to its first `keep` tokens; the number kept (0: refused)."""
        self.llama.seq_rm(slot, 0, -1)
        if self.llama.set_seq_state(slot, entry.state, entry.size) and self.llama.seq_rm(slot, keep, -1):
            self.prompt_cache.hits += 1
            return keep
        self.llama.seq_rm(slot, 0, -1)
        return 0

    def keep_prefix(self, slot: int, source: int, reuse: int) -> int:
        """Make `slot`'s KV hold the first `reuse` prompt tokens (kept, or copied from `source`); the number actually
        kept. A KV edit llama.cpp refuses (recurrent or hybrid models cannot cut a sequence at a position) means the
        prefix is recomputed instead: 0."""
        if source == slot:
            if self.llama.seq_rm(slot, reuse, -1):  # keep the shared prefix, drop the rest
                return reuse
        else:
            # In one unified pool the cells are shared; across per-slot streams llama.cpp copies
            # only whole streams (a partial copy aborts), so copy it all and trim.
            self.llama.seq_rm(slot, 0, -1)
            if reuse > 0 and self.kv_unified:
                self.llama.seq_cp(source, slot, 0, reuse)
                return reuse
            if reuse > 0:
                self.llama.seq_cp(source, slot, -1, -1)
                if self.llama.seq_rm(slot, reuse, -1):
                    return reuse
        self.llama.seq_rm(slot, 0, -1)  # a whole-sequence removal always succeeds
        return 0
