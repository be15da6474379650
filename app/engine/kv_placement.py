"""Where a prompt goes in the KV: which idle slot takes it, what of it is already there (kept in the slot, copied from
another slot, or restored from the prompt cache), and what a slot held goes to the prompt cache before it is
overwritten. The decode thread's alone: every KV edit of placement happens between steps.

The slot is the lowest-numbered idle one, so busy slots stay packed: with a KV stream per slot, llama.cpp decodes
only runs of consecutive sequence ids together, and 8 decoding sequences spread over 16 slots took twice as long a
step as 8 packed ones. An idle slot already holding a real prefix (MIN_COPY_TOKENS more) is taken instead:
recomputing or copying that prefix costs more than a gap. Batch lines (app/engine/batch_rows.py) fill the slots
from the other end, the highest-numbered idle one: beside interactive requests they get few of a step's rows,
and interactive sequences scattered among batch lines' slots would each be a run of their own (four interactive
streams among twelve batch lines took 40 ms a step where packed they take 15); so interactive requests take an
idle slot holding their prefix only below every batch line's slot. At least the last prompt token is always
recomputed, so there are logits to sample from. Only KV computed in the prompt's cache scope is reused (kept, copied or
restored): other scopes' prefixes count as nothing. A prefix never ends inside one of the prompt's images.

Beyond the replica's memory, the persistent tiers (app/kvstore: the node's disk, the cluster's store; `tiers`)
keep what the prompt cache keeps, written in the background. A prompt whose longest stored prefix is there and not
in a slot or in memory has it read while the request is prepared (`prefetch`, on the preparation pool: the request
that benefits waits, nobody else), when reading it is cheaper than prefilling it at this replica's own rates; its
admission then restores it like a prompt-cache entry. Prompts with images are kept in memory only (an image's
positions hold pseudo ids, not text)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..kvstore.tiers import TieredStore
from .prompt_cache import PromptCache
from .slots import Generation, Slot, SlotState, common_prefix
from .vision import ImageSpan, image_boundary

MIN_COPY_TOKENS = 16
# Read rates assumed for a tier this replica has not read from yet (bytes/s): a local disk, a network store.
ASSUMED_READ_RATE = {"disk": 200e6, "cluster": 50e6}

# Where a request's reused prefix came from (Started.cached_from, its trace span, metrics).
FROM_SLOT, FROM_MEMORY = "slot", "memory"


@dataclass(eq=False)
class Prefetched:
    """A state read from a persistent tier for one prompt: the tokens it holds, its buffer, the tier, and how much
    of the prompt it holds."""

    tokens: np.ndarray
    state: Any
    size: int
    tier: str
    shared: int


class KVPlacement:
    def __init__(self, llama: Any, slots: list[Slot], prompt_cache: PromptCache, kv_unified: bool,
                 tiers: TieredStore | None = None, prefill_rate: Callable[[], float] = lambda: 0.0) -> None:
        self.llama = llama
        self.slots = slots
        self.prompt_cache = prompt_cache
        self.kv_unified = kv_unified
        self.tiers = tiers
        self.prefill_rate = prefill_rate  # this replica's prompt tokens per second (0: not measured yet)
        self.prefetch_skipped = 0  # stored prefixes not read because prefilling them was measured cheaper
        # Slots left idle with their KV since the engine last had nothing to do: it goes to the prompt cache then,
        # so the next request's admission (which would save it first, before overwriting) finds it saved.
        self.idle_kv: list[int] = []

    def prefetch(self, gen: Generation) -> Prefetched | None:
        """Any thread (a request's preparation): the longest prefix of `gen`'s prompt the persistent tiers hold, read,
        when it is longer than what a slot or the prompt cache holds and reading it is cheaper than prefilling the
        difference; None otherwise (nothing is read)."""
        tiers = self.tiers
        if tiers is None or not gen.req.cache_prompt or gen.req.prompt_logprobs or len(gen.prompt) < tiers.min_tokens:
            return None
        tokens = np.asarray(gen.prompt, dtype=np.int32)
        match = tiers.longest(tokens, gen.store_scope)
        if match is None:
            tiers.missed()
            return None
        local = self.prompt_cache.longest(gen.prompt, gen.kv_scope)
        for slot in self.slots:  # read without the decode thread's ordering: a hint, as the decision is
            if slot.scope == gen.kv_scope:
                local = max(local, common_prefix(list(slot.tokens), gen.prompt))
        gain = min(match.shared, len(gen.prompt) - 1) - local
        if gain < MIN_COPY_TOKENS:
            return None
        rate = self.prefill_rate()
        read_s = match.record.size / (tiers.read_rate(match.tier) or ASSUMED_READ_RATE.get(match.tier, 50e6))
        if rate > 0 and read_s >= gain / rate:
            self.prefetch_skipped += 1
            return None
        payload = tiers.fetch(match)
        if payload is None:
            return None
        return Prefetched(match.record.tokens, self.llama.state_buffer(payload), len(payload), match.tier,
                          match.shared)

    def place(self, prompt: list[int], scope: str, reuse: bool = True, images: list[ImageSpan] | None = None,
              prefetched: Prefetched | None = None, batch: bool = False) -> tuple[Slot, int, str]:
        """An idle slot for `prompt`, its KV holding the longest reusable prefix; (slot, tokens kept, where from:
        FROM_SLOT, FROM_MEMORY, a persistent tier's name, or "" for nothing). The slot's own prefix is kept; a
        longer one is copied in from another slot (a busy slot's earlier positions never change), restored from
        the prompt cache in host memory, or restored from a state a persistent tier had (`prefetched`), after what
        the slot held went to the prompt cache."""
        images = images or []
        prefix = {slot.index: image_boundary(common_prefix(slot.tokens, prompt), images)
                  if reuse and slot.scope == scope else 0 for slot in self.slots}
        if batch:
            target = next(slot for slot in reversed(self.slots) if slot.state is SlotState.IDLE)
        else:
            target = self.lowest_idle()
            below = min((s.index for s in self.slots if s.gen is not None and s.gen.req.batch), default=len(self.slots))
            best_idle = max((s for s in self.slots if s.state is SlotState.IDLE and s.index < below),
                            key=lambda s: prefix[s.index], default=target)
            if prefix[best_idle.index] - prefix[target.index] >= MIN_COPY_TOKENS:
                target = best_idle
        source = max(self.slots, key=lambda s: (prefix[s.index], s is target))
        if prefix[source.index] - prefix[target.index] < MIN_COPY_TOKENS:
            source = target  # copying a stream is only worth it for a real prefix
        cached, held = self.prompt_cache.best(prompt, scope) if reuse else (None, 0)
        held = image_boundary(held, images)
        stored = image_boundary(min(prefetched.shared, len(prompt) - 1), images) if reuse and prefetched else 0
        if stored - max(prefix[source.index], held) >= MIN_COPY_TOKENS:
            self.save(target, keep=0)
            kept = self._restore(target.index, prefetched.state, prefetched.size, stored)
            if kept:
                # In memory too: the next prompt of this conversation finds it there.
                self.prompt_cache.put(prefetched.tokens, prefetched.state, prefetched.size, scope)
                return target, kept, prefetched.tier
            target.tokens = []
        if cached is not None and held - prefix[source.index] >= MIN_COPY_TOKENS:
            self.save(target, keep=0)
            kept = self._restore(target.index, cached.state, cached.size, min(held, len(prompt) - 1))
            if kept:
                self.prompt_cache.hits += 1
                return target, kept, FROM_MEMORY
            target.tokens = []  # a refused restore leaves the slot's KV empty
            if source is target:
                return target, 0, ""
        keep = min(prefix[source.index], len(prompt) - 1)
        self.save(target, keep=keep if source is target else 0)
        kept = self.keep_prefix(target.index, source.index, keep)
        return target, kept, FROM_SLOT if kept else ""

    def lowest_idle(self) -> Slot:
        return next(slot for slot in self.slots if slot.state is SlotState.IDLE)

    def save(self, slot: Slot, keep: int) -> None:
        """Before `slot`'s KV past `keep` tokens is overwritten: store it in the prompt cache, and queue it for the
        persistent tiers (written in the background) unless it holds an image."""
        if len(slot.tokens) - keep < MIN_COPY_TOKENS:
            return
        memory = self.prompt_cache.worth_keeping(slot.tokens, slot.scope)
        tokens = np.asarray(slot.tokens, dtype=np.int32)
        tiers = self.tiers is not None and bool(slot.store_scope) and int(tokens.min()) >= 0 \
            and self.tiers.wants(tokens, slot.store_scope)
        if memory or tiers:
            state, size = self.llama.seq_state(slot.index)
            if size and memory:
                self.prompt_cache.put(slot.tokens, state, size, slot.scope)
            if size and tiers:
                self.tiers.save(tokens, state, size, slot.store_scope)

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

    def save_before_close(self) -> None:
        """The engine is closing (a pool evicts the model, a replica stops): the idle slots' KV not saved yet goes to
        the persistent tiers, which outlive it (the decode thread, before it ends)."""
        if self.tiers is None:
            return
        for index in self.idle_kv:
            slot = self.slots[index]
            if slot.state is SlotState.IDLE:
                self.save(slot, keep=0)
        self.idle_kv = []

    def _restore(self, slot: int, state: Any, size: int, keep: int) -> int:
        """A saved state into `slot`, cut to its first `keep` tokens; the number kept (0: refused)."""
        self.llama.seq_rm(slot, 0, -1)
        if self.llama.set_seq_state(slot, state, size) and self.llama.seq_rm(slot, keep, -1):
            return keep
        self.llama.seq_rm(slot, 0, -1)
        return 0

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"prompt_cache": self.prompt_cache.stats()}
        if self.tiers is not None:
            out["kv_tiers"] = {**self.tiers.stats(), "prefetch_skipped": self.prefetch_skipped}
        return out

    def keep_prefix(self, slot: int, source: int, reuse: int) -> int:
        """Make `slot`'s KV hold the first `reuse` prompt tokens (kept, or copied from `source`); the number actually
        kept. A KV edit llama.cpp refuses (recurrent or hybrid models cannot cut a sequence at a position) means the
        prefix is recomputed instead: 0."""
        if source == slot:
            if self.llama.seq_rm(slot, reuse, -1):  # keep the shared prefix, drop the rest
                return reuse
        else:
            # In one unified pool the cells are shared; across per-slot streams llama.cpp copies only whole streams
            # (a partial copy aborts), all n_ctx cells of it, used or not: the source's state is read and written
            # instead (its used cells only: 0.8 ms for 90 tokens where the stream copy took 6-9.5, a 2,048-cell
            # stream of the bundled model), then trimmed; the whole-stream copy where llama.cpp refuses that.
            self.llama.seq_rm(slot, 0, -1)
            if reuse > 0 and self.kv_unified:
                self.llama.seq_cp(source, slot, 0, reuse)
                return reuse
            if reuse > 0:
                state, size = self.llama.seq_state(source)
                if not (size and self.llama.set_seq_state(slot, state, size)):
                    self.llama.seq_rm(slot, 0, -1)
                    self.llama.seq_cp(source, slot, -1, -1)
                if self.llama.seq_rm(slot, reuse, -1):
                    return reuse
        self.llama.seq_rm(slot, 0, -1)  # a whole-sequence removal always succeeds
        return 0
