"""A sequence slot of the llama.cpp context, and the generation that occupies it.

Like llama.cpp's `server_slot`: a slot has an explicit state and owns the tokens its KV holds. The
tokens outlive the generation (a later prompt with the same prefix reuses them), so they belong to
the slot, not to the request.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .events import Event, TokenLogprob
from .llama import SamplerChain
from .lora import BASE, AdapterSet
from .params import GenerationRequest
from .reasoning_budget import ReasoningTracker
from .speculation import DraftBudget
from .stop import StopMatcher
from .vision import ImageSpan, next_image, release_all

Sink = Callable[[Event], None]
"""Receives one generation's events. Called through the engine's publisher, on its thread."""


class SlotState(Enum):
    IDLE = "idle"
    PREFILLING = "prefilling"    # prompt tokens still to decode
    FORKING = "forking"          # another choice of its request: waits for the first choice's prompt
    GENERATING = "generating"    # one sampled token per step


@dataclass(eq=False)
class Generation:
    """One request's progress through the engine."""

    req: GenerationRequest
    sink: Sink
    prompt: list[int]
    max_tokens: int
    stop: StopMatcher
    sampler: SamplerChain | None = None
    n_past: int = 0          # tokens of this request in the slot's KV
    cached: int = 0          # prompt tokens reused from the slot's KV
    generated: int = 0
    pending_tokens: int = 0  # sampled tokens whose text is still held back (UTF-8, stop matching)
    last_token: int = -1
    logits_at: int = -1      # index in the current batch whose logits this generation samples
    decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    index: int = 0           # the choice (n > 1)
    choices: list["Generation"] = field(default_factory=list)  # the first choice's siblings, until forked
    slot: int = -1           # the slot it occupies
    scored_from: int = -1    # batch index of this step's first prompt token, when the prompt is scored
    prompt_scores: list[TokenLogprob] = field(default_factory=list)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)  # for text still held back
    token_ids: list[int] = field(default_factory=list)  # generated ids, kept when the request asks for them
    queued_at: float = 0.0   # monotonic time of submission (admission fairness)
    images: list[ImageSpan] = field(default_factory=list)  # the prompt's images (shared by its choices)
    adapters: AdapterSet = BASE  # the LoRA adapters it decodes under (only with others of the same set)
    draft: DraftBudget | None = None  # its speculative draft length (None: it never drafts)
    drafter: Any = None  # its drafting state (Drafter.sequence: prompt lookup's n-gram index)
    drafts: list[int] = field(default_factory=list)  # the draft tokens in this step's batch, after last_token
    store_scope: str = ""  # its scope in the KV kept beyond the replica (kvstore/key.py scope_digest)
    prefetched: Any = None  # a state read from a persistent tier while it was prepared (kv_placement.Prefetched)
    reasoning: ReasoningTracker | None = None  # its reasoning and budget (None: the request tracks none)
    forced: list[int] = field(default_factory=list)  # tokens it takes next instead of sampling (a reasoning's close)
    forcing: int = 0  # of those, how many follow last_token in this step's batch
    row_step: int = 0  # the engine step it last had a row in while batch rows were bounded (batch_rows.py)

    @property
    def request_id(self) -> str:
        return self.req.request_id

    @property
    def kv_scope(self) -> str:
        """Whose KV this generation may reuse and leaves behind: its cache scope, under its adapter set."""
        return self.adapters.scope(self.req.cache_scope)

    @property
    def slots_needed(self) -> int:
        """Idle slots this request takes at once: one per choice."""
        return 1 + len(self.choices)

    def free(self) -> None:
        """Free this generation's native objects: its sampler chain and those of its choices still
        attached, and its images not yet encoded (a request that never reaches a slot, leaves the queue,
        or leaves its slot). Idempotent."""
        for g in (self, *self.choices):
            if g.sampler is not None:
                g.sampler.free()
                g.sampler = None
        release_all(self.images)
        self.prefetched = None


@dataclass(eq=False)
class Slot:
    index: int
    tokens: list[int] = field(default_factory=list)  # what this slot's KV holds, in order
    gen: Generation | None = None
    state: SlotState = SlotState.IDLE
    scope: str = ""  # the KV scope (Generation.kv_scope) that computed `tokens`: only that scope reuses them
    store_scope: str = ""  # and its scope beyond the replica (Generation.store_scope)

    def occupy(self, gen: Generation, reused: int, state: SlotState = SlotState.PREFILLING) -> None:
        self.tokens = gen.prompt[:reused]
        self.scope = gen.kv_scope
        self.store_scope = gen.store_scope
        gen.n_past = gen.cached = reused
        gen.slot = self.index
        self.gen, self.state = gen, state

    def forked(self, cached: int) -> None:
        """The KV now holds the whole prompt (copied from the first choice's slot)."""
        gen = self.gen
        self.tokens = list(gen.prompt)
        gen.n_past, gen.cached = len(gen.prompt), cached
        self.state = SlotState.GENERATING

    def pending_prompt(self) -> list[int]:
        """The prompt tokens to decode next: up to the next image (decoded on its own), or none."""
        gen = self.gen
        if gen is None or self.state is not SlotState.PREFILLING:
            return []
        image = next_image(gen.n_past, gen.images) if gen.images else None
        return gen.prompt[gen.n_past:image.start if image is not None else None]

    def pending_image(self) -> ImageSpan | None:
        """The image whose turn it is to be decoded into this slot, if any."""
        gen = self.gen
        if gen is None or self.state is not SlotState.PREFILLING or not gen.images:
            return None
        image = next_image(gen.n_past, gen.images)
        return image if image is not None and image.start == gen.n_past else None

    def advanced(self, tokens: list[int]) -> None:
        """`tokens` were decoded into this slot's KV."""
        gen = self.gen
        self.tokens.extend(tokens)
        gen.n_past += len(tokens)
        if gen.n_past >= len(gen.prompt):
            self.state = SlotState.GENERATING

    def vacate(self, keep_cache: bool) -> None:
        self.gen, self.state = None, SlotState.IDLE
        if not keep_cache:
            self.tokens = []


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
