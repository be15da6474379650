"""Continuous batching over llama.cpp sequence slots, driven by one background thread: the loop.

Each step decodes one batch that holds the next token of every generating sequence plus chunks of newly admitted
prompts, then samples each sequence with its own sampler chain. Requests join and leave between steps; a
finished, failed or cancelled request frees its slot at once. A free slot keeps its tokens' KV so a later prompt
with the same prefix reuses it.

The lock guards only the queue (waiting requests, cancellations, closing): `submit`, `cancel` and `stats` never
wait for slow work. A request's slow setup (its checks and tokens: intake.py; its sampler chains with their
grammar) is done by `prepare`, on the caller's thread, before it is queued; the decode thread takes waiting
requests out under the lock and places them in the KV (kv_placement.py: copies, prompt-cache restores and saves)
after releasing it. Slots belong to the decode thread alone.

Waiting requests take idle slots first come, first served, with bounded backfill; when several keys (tenants)
wait, the next slot goes to the one holding the fewest slots for its weight (admission.py, `fair_share`). LoRA
adapters apply to the whole context, so a step decodes the sequences of one adapter set (adapter_turns.py).
Speculative decoding (speculation.py), where the model has it on: a generating sequence puts its last token and
the drafts proposed for it into the same batch, with logits at every row, and the request's own sampler verifies
them. A reasoning budget (reasoning_budget.py), when spent, has the sequence take the tokens that close the
reasoning instead of sampling them: they go into the next batch after its last token, as accepted drafts would, and
each is taken at its row through the sampler's state, the grammar in force and the stop matching.

The engine knows nothing of asyncio: a step's events go out in one call of `publish` (stream.py's publisher
hands them to each event loop in one wake-up).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import replace
from operator import attrgetter
from typing import Any

from ..config.spec import ModelSpec, place
from . import hardware
from .adapter_turns import AdapterTurns
from .batch_rows import RECENT_S, batch_row_budget
from .admission import (
    BACKFILL_S, BATCH_WAIT_S, InteractiveDemand, RecentTenants, admissible, batch_share, held_back, in_share_order,
    interactive_first,
)
from .constraint import MaskWorker, grammar_tokenizer
from .decode_thread import DecodeThread
from .errors import EngineError, bad_input, internal, overloaded
from .events import Event, Failed, Finished, PromptLogprobs, Started, Text, TokenLogprob
from .intake import Intake
from ..kvstore.key import scope_digest
from .kv_placement import KVPlacement
from .kv_tiers import open_tiers
from .llama import Batch, EmbdBatch, LlamaModelContext, NoValidToken, SamplerChain, decode, decode_embd, logprobs_at
from . import lora
from .lora import LoraAdapter
from .params import GenerationRequest, ImageInput, InfillPrompt
from .prompt_cache import PromptCache
from .reasoning_budget import ReasoningTracker, token_texts
from .slots import Generation, Sink, Slot, SlotState
from .speculation import Speculation
from .step_times import StepTimes
from .stop import StopMatcher
from .vision import Projector, release_all

log = logging.getLogger("llamaray.engine")

Publish = Callable[[list[tuple[Sink, Event]]], None]

_TENANT = attrgetter("req.tenant")
# A step with at least this many prompt tokens measures the replica's prefill rate (fewer: dominated by decoding).
PREFILL_SAMPLE_TOKENS = 64


def call_each(items: list[tuple[Sink, Event]]) -> None:
    """The plain publisher: each sink called in turn (on the engine thread)."""
    for sink, event in items:
        sink(event)


class LlamaEngine(DecodeThread):
    def __init__(self, spec: ModelSpec, publish: Publish = call_each) -> None:
        spec = place(spec)  # auto values not decided by the caller (a replica does): this node's cores, no GPU
        super().__init__(f"llama-engine-{spec.id}")
        self.spec = spec
        self.llama = LlamaModelContext(
            spec.path, n_ctx_per_seq=spec.n_ctx, n_seq_max=spec.n_seq_max, n_batch=spec.n_batch,
            n_threads=spec.n_threads, n_threads_batch=spec.n_threads_batch, n_gpu_layers=spec.n_gpu_layers,
            kv_unified=spec.kv_unified, type_k=spec.cache_type_k, type_v=spec.cache_type_v,
            extra_buffers=hardware.use_extra_buffers(spec.cpu_extra_buffers, hardware.system_info()),
        )
        self.n_ctx = spec.n_ctx
        self.projector: Projector | None = None
        self.speculation: Speculation | None = None
        if spec.mmproj_path:
            try:
                self.projector = Projector(spec.mmproj_path, self.llama, spec.n_threads_batch, spec.n_gpu_layers != 0)
            except BaseException:
                self.llama.close()
                raise
        self._publish = publish
        self._batch = Batch(max(spec.n_batch, spec.n_seq_max))
        self._admitting: list[Generation] = []  # out of the queue, not yet in their slots
        self._cancelled: set[str] = set()
        self.backfill_s = BACKFILL_S  # admission.py: how long a blocked request lets smaller ones pass
        self.fair_share = spec.fair_share  # admission.py: keys share the slots by weight when they compete
        self._recent = RecentTenants()  # admission.py: the keys that used the model lately
        self._demand = InteractiveDemand()  # admission.py: the slots interactive requests used lately
        self._preempting: list[Slot] = []  # batch lines whose slots interactive requests wait for
        self._deferred: list[Generation] = []  # batch lines that waited too long, out of the queue
        self.batch_preempted = 0
        self.batch_deferred = 0
        self.step_times = StepTimes()  # batch_rows.py: what batch rows add to a step beside interactive ones
        self._batch_starved = 0  # steps since batch lines last had a row while interactive requests ran
        self.batch_rows_held = 0  # rows batch lines went without, beside interactive requests (stats)
        self._interactive_step = (0, float("-inf"))  # its decoding interactive sequences and time (batch_rows.py)
        self.slots = [Slot(i) for i in range(spec.n_seq_max)]
        self.intake = Intake(spec, self.llama, self.projector, len(self.slots))
        # Prompt tokens per second this replica prefills (a moving average): whether reading a stored prefix beats
        # computing it again (kv_placement.py).
        self.prefill_rate = 0.0
        self._step_prompt_tokens = 0
        self.placement = KVPlacement(self.llama, self.slots, PromptCache(int(spec.prompt_cache_mib * (1 << 20))),
                                     spec.kv_unified, open_tiers(spec), lambda: self.prefill_rate)
        self.adapters = AdapterTurns(spec, self.llama, self._cv)
        self._outbox: list[tuple[Sink, Event]] = []
        self.steps = 0
        self.tokens_decoded = 0  # batch tokens decoded, prompt and generated (tests, stats)
        # Recent duration of one busy step (decode, sampling, publishing), a moving average: streams
        # use it to tell whether the next step's tokens would still arrive within their window.
        self.step_s = 0.0
        self._grammar_tokenizer: Any = None  # llguidance's view of the vocabulary, built by the first grammar
        self._grammar_lock = threading.Lock()
        self._masks = MaskWorker()
        # Masks beside the decode only where a core is free for them (a GPU decodes, or the decode's threads
        # leave one): on a CPU whose cores all decode, the mask thread takes one from llama.cpp's workers,
        # which wait for each other, and costs more than it saves (bench.structured --masks: 0.86-0.88x
        # beside against 0.94-0.96x after, on 2 cores and 2 threads). There a greedy request's sampled
        # token is checked first instead, and the mask made only when it is refused.
        self.masks_beside_decode = hardware.spare_core_for_masks(spec)
        # Speculative decoding: off where the model's config leaves it off, and for recurrent or hybrid
        # models, whose state cannot be cut back past rejected drafts.
        if spec.speculative is not None and self.llama.can_cut_back:
            try:
                self.speculation = Speculation(spec.speculative, spec, self.llama, self._batch)
            except BaseException:
                self._batch.free()
                self.close_models()
                raise

    # -- called from any thread ------------------------------------------------------------------
    def prepare(self, req: GenerationRequest, sink: Sink) -> Generation:
        """The request's checks and tokens (intake.py), then each choice's sampler chain (its grammar parsed);
        raises an engine error (bad input, context exceeded) before anything is queued. Slow for long prompts and
        large grammars: call it off the event loop (stream.py does). With n > 1 the first choice carries the
        others: they take slots together and share its prompt's KV."""
        admitted = self.intake.admit(req)
        try:
            adapters = self.adapters.resolve(req.adapters)
        except BaseException:
            release_all(admitted.images)
            raise
        prompt, limit = admitted.prompt, admitted.limit

        def choice(index: int) -> Generation:
            return Generation(req=req, sink=sink, prompt=prompt, stop=StopMatcher(req.stop), index=index,
                              max_tokens=limit if limit is not None else self.n_ctx - len(prompt),
                              images=admitted.images)

        first = choice(0)
        first.choices = [choice(i) for i in range(1, req.n)]
        store_scope = scope_digest(req.cache_scope, adapters.contents)
        for g in (first, *first.choices):
            g.adapters = adapters
            g.store_scope = store_scope
            g.draft = self.speculation.budget(req) if self.speculation is not None else None
            g.drafter = self.speculation.sequence() if g.draft is not None else None
        try:
            for g in (first, *first.choices):
                g.reasoning, answer_at = self._reasoning_for(req)
                g.sampler = self._sampler_for(req, g.index, answer_at)
        except BaseException as exc:
            first.free()
            if not isinstance(exc, Exception):
                raise
            if isinstance(exc, EngineError):
                raise
            log.exception("could not build the sampler for %s", req.request_id)
            raise internal("Could not set up sampling for this request.") from None
        first.prefetched = self.placement.prefetch(first)
        return first

    @property
    def speculative(self) -> Any:
        """The model's speculative settings in force (None: off)."""
        return self.speculation.settings if self.speculation is not None else None

    def discard(self, gen: Generation) -> None:
        """A prepared generation that will not be submitted: its samplers and images freed. Any thread."""
        gen.free()

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """`text`'s tokens as `prepare` counts a prompt (content marks honoured). Any thread."""
        return self.intake.tokenize(text, add_special)

    def infill_tokens(self, infill: InfillPrompt, limit: int | None) -> list[int]:
        """A fill-in-the-middle prompt's tokens as a generation of at most `limit` tokens lays it out (bad input
        naming the model where its vocabulary has no FIM tokens). Any thread."""
        return self.intake.infill(infill, limit)

    def count_prompt(self, prompt: str, images: list[ImageInput]) -> int:
        """A rendered prompt's tokens as `prepare` counts them, its images' positions included. Any thread."""
        return self.intake.count_prompt(prompt, images)

    def detokenize(self, tokens: list[int]) -> str:
        """The text of token ids; an id outside the vocabulary is bad input naming its place. Any thread."""
        return self.intake.detokenize(tokens)

    # -- LoRA adapters (any thread): adapter_turns.py ---------------------------------------------------------
    def load_adapter(self, name: str, path: str) -> LoraAdapter:
        """Load the LoRA adapter GGUF at `path` for this engine's model, as `name`: requests then name it in
        GenerationRequest.adapters. Checked against the model first: lora.AdapterMismatch (nothing loaded) for
        an adapter made for another base, naming both. Slow (reads the file): call it off the event loop.
        A name already loaded is a ValueError (unload it first)."""
        return self.adapters.load(name, path, lambda: self._closing)

    def unload_adapter(self, name: str) -> bool:
        """Stop accepting requests for adapter `name` (False: none loaded); llama.cpp's adapter is freed on
        the decode thread once no queued or running generation uses it."""
        return self.adapters.unload(name)

    def adapter_names(self) -> list[str]:
        return self.adapters.names()

    def submit(self, gen: Generation) -> None:
        """Queue a prepared generation (the engine owns it from here). Any thread."""
        with self._cv:
            gone = self.adapters.gone(gen.adapters)
            if gone is None and self.broken is None:
                gen.queued_at = time.monotonic()
                if not gen.req.batch:  # a batch line holds no slot back for its key (admission.py)
                    self._recent.saw(gen.req.tenant, gen.queued_at)
                self._enqueue(gen)
                return
        gen.free()
        raise lora.unknown_adapter(self.spec.id, gone.name) if gone is not None else self.unavailable_error()

    def cancel(self, request_id: str) -> None:
        with self._cv:
            self._cancelled.add(request_id)
            self._cv.notify()

    def stats(self) -> dict[str, Any]:
        with self._cv:
            return {"running": self.active, "waiting": self.waiting, "slots": len(self.slots),
                    "steps": self.steps, "tokens_decoded": self.tokens_decoded, "healthy": self.healthy(),
                    **self.placement.stats(),
            "prefill_tokens_per_s": round(self.prefill_rate, 1),
                    "adapters": sorted(self.adapters.loaded), "adapter_switches": self.adapters.switches,
                    "batch_running": sum(s.gen is not None and s.gen.req.batch for s in self.slots),
                    "batch_preempted": self.batch_preempted, "batch_deferred": self.batch_deferred,
                    "batch_rows_held": self.batch_rows_held, "step_seconds_by_rows": self.step_times.as_dict(),
                    **(self.speculation.stats() if self.speculation is not None else
                       {"spec_decode": {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}}),
                    **({"images_held": self.projector.held} if self.projector is not None else {})}

    @property
    def waiting(self) -> int:
        """Requests submitted and not yet in a slot (read without the lock: a hint)."""
        return len(self._waiting) + len(self._admitting)

    @property
    def active(self) -> int:
        """Occupied slots (read without the lock: a hint, not an exact count)."""
        return sum(slot.gen is not None for slot in self.slots)

    def close(self) -> None:
        super().close()
        if self.placement.tiers is not None:
            self.placement.tiers.close()
        # A closed engine is freed only when Python's cycle collector finds it (it and its placement refer to each
        # other), which counts objects, not bytes: a pool replica that reloaded its models kept every closed
        # engine's prompt cache, gigabytes within minutes. So its largest holding goes now.
        self.placement.prompt_cache.clear()
        self._masks.close()
        self._batch.free()
        if self.llama.ctx is not None and not self._thread.is_alive():
            self.adapters.free_all()
        self.close_models()

    def close_models(self) -> None:
        """The draft model, the projector and the model freed (also when the engine fails to start)."""
        if self.speculation is not None:
            self.speculation.close()
        if self.projector is not None:
            self.projector.close()
        self.llama.close()

    # -- the decode thread -----------------------------------------------------------------------
    def _loop(self) -> None:
        placement = self.placement
        while True:
            with self._cv:
                while not (self._closing or self._waiting or self.active or self._cancelled or self.adapters.retired):
                    if placement.idle_kv:
                        break
                    self._cv.wait()
                if self._closing:
                    self.placement.save_before_close()
                    return
                cancelled, self._cancelled = self._cancelled, set()
                dropped = self._unqueue(cancelled)
                self._admitting = self._take_admissible()
                if self._preempting:  # their slots are free at once: the requests that wait for them go in now
                    self._preempt_batch(self._preempting)
                    self._admitting += self._take_admissible()
                deferred, self._deferred = self._deferred, []
                unused = self.adapters.unused_retired(
                    (*self._waiting, *self._admitting, *(s.gen for s in self.slots if s.gen)))
            # Without the lock from here: KV edits, copies and saves never hold up the callers.
            for gen in dropped:
                gen.free()
            for gen in deferred:
                gen.free()
                self._out(gen, Failed(overloaded(
                    "This batch line waited for a slot the model's interactive requests kept; it goes back to its "
                    "batch, to be sent again.", code="batch_deferred")))
            self._release_cancelled(cancelled)
            self.adapters.free(unused)
            self._admit(self._admitting)
            self._admitting = []
            self._flush()
            if not self.active and placement.idle_kv:
                placement.save_idle(waiting=bool(self._waiting))
            if self.active:
                started = time.perf_counter()
                self._step()
                self._flush()
                elapsed = time.perf_counter() - started
                self.step_s = elapsed if self.step_s == 0.0 else 0.8 * self.step_s + 0.2 * elapsed
                self.step_times.observe(self._batch.n, elapsed)
                if self._step_prompt_tokens >= PREFILL_SAMPLE_TOKENS:
                    rate = self._step_prompt_tokens / elapsed
                    self.prefill_rate = rate if self.prefill_rate == 0 else 0.8 * self.prefill_rate + 0.2 * rate

    def _out(self, gen: Generation, event: Event) -> None:
        self._outbox.append((gen.sink, event))

    def _flush(self) -> None:
        if self._outbox:
            out, self._outbox = self._outbox, []
            self._publish(out)

    def _unqueue(self, ids: set[str]) -> list[Generation]:
        """Waiting requests cancelled (under the lock); the caller frees their samplers."""
        if not ids or not self._waiting:
            return []
        dropped = [g for g in self._waiting if g.request_id in ids]
        if dropped:
            self._waiting = deque(g for g in self._waiting if g.request_id not in ids)
        return dropped

    def _release_cancelled(self, ids: set[str]) -> None:
        for slot in self.slots:
            if slot.gen is not None and slot.gen.request_id in ids:
                self._release(slot, keep_cache=False)

    def _take_admissible(self) -> list[Generation]:
        """Waiting requests that idle slots can take now, out of the queue (under the lock): interactive requests
        first, then batch lines in what they leave (admission.py, `batch_share`); the batch lines whose slots
        interactive requests wait for go in `_preempting`, those that waited too long in `_deferred`."""
        self._preempting = []
        if not self._waiting:
            return []
        idle = sum(slot.state is SlotState.IDLE for slot in self.slots)
        now, waiting = time.monotonic(), self._waiting
        held, reserve = Counter(), 0
        if self.fair_share:
            held = Counter(s.gen.req.tenant for s in self.slots if s.gen is not None)
            waiting = in_share_order(self._waiting, held)
            # A slot kept from keys already running something, for a key that used the model lately and is not in
            # line now (it may be back any moment).
            reserve = held_back(self._recent.recent(now), held, waiting, len(self.slots))
        interactive, batch = interactive_first(waiting)
        taken = admissible(interactive, idle, now, self.backfill_s, reserve=reserve, tenant_of=_TENANT,
                           holding=held) if interactive and idle else []
        idle -= sum(g.slots_needed for g in taken)
        if batch or any(s.gen is not None and s.gen.req.batch for s in self.slots):
            running_batch = [s for s in self.slots if s.gen is not None and s.gen.req.batch]
            chosen_now = set(map(id, taken))
            still = sum(g.slots_needed for g in interactive if id(g) not in chosen_now)
            interactive_held = sum(s.gen is not None and not s.gen.req.batch for s in self.slots)
            peak = self._demand.update(interactive_held + sum(g.slots_needed for g in interactive), now)
            share = batch_share(len(self.slots), idle, len(running_batch), still, peak)
            if share.preempt:
                # The lines that have generated least lose least.
                running_batch.sort(key=lambda s: s.gen.generated)
                self._preempting = running_batch[:share.preempt]
            if share.admit and batch:
                taken += admissible(batch, share.admit, now, self.backfill_s)
            chosen_now = set(map(id, taken))
            self._deferred = [g for g in batch if id(g) not in chosen_now and now - g.queued_at >= BATCH_WAIT_S]
            if self._deferred:
                self.batch_deferred += len(self._deferred)
                chosen_now |= set(map(id, self._deferred))
                self._waiting = deque(g for g in self._waiting if id(g) not in chosen_now)
                return taken
        if taken:
            chosen = set(map(id, taken))
            self._waiting = deque(g for g in self._waiting if id(g) not in chosen)
        return taken

    def _preempt_batch(self, slots: list[Slot]) -> None:
        """Batch lines out of their slots for interactive requests that wait (on the decode thread, under the lock:
        no KV is edited, the slots keep what they hold for a later prompt): each fails with a retryable 503 that
        sends it back to its batch."""
        for slot in slots:
            gen = slot.gen
            choices = self._take_choices(gen)
            self._release(slot, keep_cache=True)
            for choice in choices:
                self._release(self.slots[choice.slot], keep_cache=True)
            self.batch_preempted += 1
            self._out(gen, Failed(overloaded(
                "This batch line gave its slot to an interactive request; it goes back to its batch, to be sent "
                "again.", code="batch_preempted")))
        self._preempting = []

    def _admit(self, admitted: list[Generation]) -> None:
        """Requests taken out of the queue into idle slots (enough of them were counted): the first
        choice where its prompt's longest reusable prefix is, its other choices into the lowest idle slots."""
        for gen in admitted:
            # Scoring the prompt needs logits at every prompt position: nothing of it is reused. Nor is
            # anything for a request that asked for none (cache_prompt false: reproducible replies).
            reuse = gen.req.cache_prompt and not gen.req.prompt_logprobs
            slot, reused, source = self.placement.place(gen.prompt, gen.kv_scope, reuse=reuse, images=gen.images,
                                                        prefetched=gen.prefetched, batch=gen.req.batch)
            gen.prefetched = None  # its buffer is the prompt cache's now, or not needed
            slot.occupy(gen, reused)
            for g in gen.choices:
                fork = self.placement.lowest_idle()
                self.placement.save(fork, keep=0)
                fork.occupy(g, 0, SlotState.FORKING)
            for g in (gen, *gen.choices):
                self._out(g, Started(prompt_tokens=len(g.prompt), cached_tokens=reused, index=g.index,
                                     queued_s=time.monotonic() - gen.queued_at, cached_from=source))

    def _reasoning_for(self, req: GenerationRequest) -> tuple[ReasoningTracker | None, int | None]:
        """A choice's reasoning tracker (None: the request tracks no reasoning), gone on past a continued reply's
        tokens; and where in those tokens the answer, and its grammar, starts (None: still in reasoning)."""
        limit = req.reasoning
        if limit is None:
            return None, 0
        close, marker = self.intake.closing(limit.message, limit.end)
        tracker = ReasoningTracker(limit, list(close), list(marker))
        answer_at = tracker.replay(token_texts(req.continue_tokens, self.llama.piece))
        return tracker, answer_at

    def _sampler_for(self, req: GenerationRequest, index: int = 0, answer_at: int | None = 0) -> SamplerChain:
        """A choice's sampler chain. `answer_at`: where in a continued reply's tokens its answer starts (None: not
        yet): a reply that starts inside its reasoning has its grammar deferred to the answer."""
        params = replace(req.sampling, seed=req.choice_seed(index)) if index else req.sampling
        sampler = SamplerChain(self.llama, params, self.grammar_tokenizer() if params.grammar else None,
                               keep_logits=req.logprobs is not None)
        sampler.deferred = sampler.constraint is not None and req.reasoning is not None and req.reasoning.starts_open
        if sampler.advance(req.continue_tokens, answer_at if sampler.deferred else 0):
            return sampler
        # A continued reply whose tokens do not fit the grammar: continue unconstrained.
        sampler.free()
        sampler = SamplerChain(self.llama, replace(params, grammar=None))
        sampler.advance(req.continue_tokens)
        return sampler

    def grammar_tokenizer(self) -> Any:
        """Built once, by the first request with a grammar (~0.3 s for a 49k vocabulary); any thread."""
        with self._grammar_lock:
            if self._grammar_tokenizer is None:
                self._grammar_tokenizer = grammar_tokenizer(self.llama.vocab)
            return self._grammar_tokenizer

    # -- one step: build the batch, decode, sample -------------------------------------------------
    def _step(self) -> None:
        self.adapters.take_turn(self.slots, self.steps)
        self._decode_image()
        planned = self._fill_batch()
        self._step_prompt_tokens = sum(len(t) for s, t in planned if s.state is SlotState.PREFILLING)
        if self._batch.n == 0:
            return
        # The grammars' masks for this step's samples, computed while the batch decodes.
        masks = self._masks.start([slot.gen.sampler.active_constraint for slot, _ in planned
                                   if slot.gen.logits_at >= 0 and slot.gen.sampler is not None
                                   and slot.gen.sampler.active_constraint is not None]) \
            if self.masks_beside_decode else None
        rc = decode(self.llama, self._batch)
        self._masks.wait(masks)
        self.steps += 1
        self.tokens_decoded += self._batch.n
        if rc != 0:
            log.warning("llama_decode returned %d for a batch of %d tokens; retrying each sequence alone",
                        rc, self._batch.n)
            self._step_one_by_one(planned)
            return
        for slot, tokens in planned:
            self._advance(slot, tokens)

    def _decode_image(self) -> None:
        """One waiting image per step, encoded and decoded into its slot's KV before the step's token
        batch (which then takes the text after it): other sequences wait for one image at a time at most."""
        slot = next((s for s in self.slots if s.pending_image() is not None and self.adapters.in_turn(s)), None)
        if slot is None:
            return
        gen, span = slot.gen, slot.pending_image()
        try:
            rows = span.embd if span.embd is not None else self.projector.encode(span)
            span.release()
            # Another choice decodes the prompt again where llama.cpp cannot copy its KV (recurrent models).
            span.embd = rows if gen.req.n > 1 else None
            rc = self._decode_rows(rows, gen.n_past, slot.index, span.non_causal)
        except Exception:  # noqa: BLE001 - fail this request, keep serving the others
            log.exception("the image of request %s could not be encoded", gen.request_id)
            rc = None
        self.steps += 1
        self.tokens_decoded += span.n_tokens
        if rc != 0:
            self.llama.seq_rm(slot.index, gen.n_past, -1)
            detail = f"llama_decode failed ({rc})" if rc is not None else "the projector failed"
            self._fail(slot, internal(f"Decoding this request's image failed: {detail}."))
            return
        slot.advanced(gen.prompt[span.start:span.end])

    def _decode_rows(self, rows: Any, pos: int, seq: int, non_causal: bool) -> int:
        """An image's rows into sequence `seq` from `pos`: in batches of n_batch, or one (non-causal)."""
        step = len(rows) if non_causal else self.spec.n_batch
        batch = EmbdBatch(min(step, len(rows)), self.llama.n_embd)
        try:
            for i in range(0, len(rows), step):
                batch.fill(rows[i:i + step], pos + i, seq)
                rc = decode_embd(self.llama, batch, non_causal)
                if rc != 0:
                    return rc
            return 0
        finally:
            batch.free()

    def _fill_batch(self) -> list[tuple[Slot, list[int]]]:
        """This step's tokens per slot: one for each generating slot (with its drafts, when it drafts), then
        prompt chunks within the batch (so a long prompt never stalls the running streams for long)."""
        batch = self._batch
        batch.clear()
        planned: list[tuple[Slot, list[int]]] = []
        generating = [s for s in self.slots if s.state is SlotState.GENERATING and self.adapters.in_turn(s)]
        generating, batch_rows = self._batch_rows(generating)
        room = batch.capacity - len(generating)  # rows left once each generating sequence has its token
        # Tokens a sequence takes without sampling (a reasoning's close) come first, within the batch, its context
        # and its max_tokens (what does not fit goes in later steps, one a step at least). Not where the KV cannot
        # be cut back past tokens a stop among them leaves unused (recurrent models): there one a step.
        for slot in generating:
            gen = slot.gen
            gen.forcing = max(0, min(len(gen.forced), room, self.n_ctx - gen.n_past - 2,
                                     gen.max_tokens - gen.generated - 1)) \
                if gen.forced and self.llama.can_cut_back else 0
            room -= gen.forcing
        # Drafting is for sequences in their turn that generate: a prefilling prompt (its images, its scored
        # positions, an n > 1 request's choices not yet forked) decodes as it always does.
        speculation = self.speculation
        chosen = speculation.choose(generating, room, self.n_ctx) \
            if speculation is not None and speculation.drafting(len(generating)) else {}
        for slot in generating:
            gen = slot.gen
            gen.drafts = chosen.get(slot.index, [])
            tokens = [gen.last_token, *gen.forced[:gen.forcing], *gen.drafts]
            planned.append((slot, tokens))
            self._put(slot, tokens, logits=True)
        for slot in self.slots:
            pending = slot.pending_prompt()[:batch.capacity - batch.n] if self.adapters.in_turn(slot) else []
            if pending and batch_rows is not None and slot.gen.req.batch:
                pending = pending[:batch_rows]
                batch_rows -= len(pending)
            if pending:
                planned.append((slot, pending))
                self._put(slot, pending, logits=slot.gen.n_past + len(pending) == len(slot.gen.prompt))
        return planned

    def _batch_rows(self, generating: list[Slot]) -> tuple[list[Slot], int | None]:
        """This step's generating sequences with only the batch lines that get a row in it (those that waited
        longest for one first), and the rows left to batch lines' prompts (None: no bound). Without interactive
        requests in the step, every batch line has its row (batch_rows.py)."""
        batch = [s for s in generating if s.gen.req.batch]
        interactive_prompt = batch_prompt = 0  # prompt tokens this step would prefill, by kind
        for slot in self.slots:
            if slot.state is SlotState.PREFILLING and self.adapters.in_turn(slot):
                n = len(slot.pending_prompt())
                if slot.gen.req.batch:
                    batch_prompt += n
                else:
                    interactive_prompt += n
        interactive_rows = len(generating) - len(batch) + interactive_prompt
        now = time.monotonic()
        if interactive_rows:
            self._interactive_step = (max(1, len(generating) - len(batch)), now)
        recent_rows, at = self._interactive_step
        wanted = len(batch) + batch_prompt
        budget = batch_row_budget(interactive_rows, interactive_prompt > 0, wanted, self.step_times,
                                  self._batch_starved, recent_rows if now - at <= RECENT_S else 0) if wanted else None
        if budget is None or budget >= wanted:
            self._batch_starved = 0
            return generating, None
        self.batch_rows_held += wanted - budget
        # A block of neighbouring slots from the line that waited longest for a row: llama.cpp decodes each run of
        # consecutive sequences as a graph of its own, so scattered rows would each cost one.
        first = min(range(len(batch)), key=lambda i: batch[i].gen.row_step, default=0)
        chosen = (batch[first:] + batch[:first])[:budget]
        dropped = {id(s) for s in batch} - {id(s) for s in chosen}
        kept = [s for s in generating if id(s) not in dropped]
        for slot in chosen:
            slot.gen.row_step = self.steps
        left = max(0, budget - len(batch))
        self._batch_starved = 0 if budget else self._batch_starved + 1
        return kept, left

    def _put(self, slot: Slot, tokens: list[int], logits: bool) -> None:
        """`tokens` into the batch at the slot's next positions; with `logits`, the last one's
        logits are kept and the generation samples from them after the decode. A prompt that is
        scored keeps the logits of every position, and so does a generating sequence with drafts
        (`logits_at` is then its first row)."""
        gen = slot.gen
        every = gen.req.prompt_logprobs and slot.state is SlotState.PREFILLING
        # Drafts are verified at every row; forced tokens are taken at theirs, scored there when logprobs are asked.
        verify = slot.state is SlotState.GENERATING and (bool(gen.drafts) or (gen.forcing > 0 and
                                                                              gen.req.logprobs is not None))
        for k, token in enumerate(tokens):
            idx = self._batch.add(token, gen.n_past + k, slot.index,
                                  every or verify or (logits and k == len(tokens) - 1))
        first = idx - len(tokens) + 1
        gen.logits_at = (first if verify else idx) if logits else -1
        gen.scored_from = first if every else -1

    def _step_one_by_one(self, planned: list[tuple[Slot, list[int]]]) -> None:
        """After a failed batch: each slot's part decoded (and sampled) alone, so the one llama.cpp
        cannot decode fails and the others go on. A failed decode may leave part of the batch in
        the KV, so every slot is first cut back to what it held before the step."""
        for slot, _ in planned:
            self.llama.seq_rm(slot.index, slot.gen.n_past, -1)
        for slot, tokens in planned:
            gen = slot.gen
            self._batch.clear()
            self._put(slot, tokens, logits=gen.logits_at >= 0)
            rc = decode(self.llama, self._batch)
            if rc != 0:
                log.error("llama_decode returned %d for request %s alone", rc, gen.request_id)
                self._fail(slot, internal(f"llama_decode failed ({rc}) for this request."))
                continue
            self._advance(slot, tokens)

    def _advance(self, slot: Slot, tokens: list[int]) -> None:
        gen = slot.gen
        if gen.forcing:
            self._take_forced(slot, tokens)
            return
        if gen.drafts:
            self.speculation.verify(slot, tokens, self._sample_or_fail)
            return
        if gen.scored_from >= 0:
            self._score_prompt(gen, tokens)
        slot.advanced(tokens)
        if gen.logits_at < 0:
            return
        if gen.generated == 0:  # the prompt is in: its scores, the other choices, or nothing to generate
            if gen.req.prompt_logprobs:
                self._out(gen, PromptLogprobs(tuple(gen.prompt_scores), gen.index))
            if gen.max_tokens == 0:
                for choice in [gen, *self._take_choices(gen)]:
                    self._finish(self.slots[choice.slot], "length")
                return
            for choice in self._take_choices(gen):
                self._fork(slot, self.slots[choice.slot])
        self._sample_or_fail(slot)
        if gen.draft is not None and slot.gen is gen:
            gen.draft.generated(gen.last_token)

    def _take_forced(self, slot: Slot, tokens: list[int]) -> None:
        """A generating sequence decoded with forced tokens after its last one (`tokens`: [last, forced...]): each
        forced token is taken at the row before it (scored from that row's logits when logprobs are asked), then
        the last row is sampled, as verified drafts would be. A limit or a stop reached among them ends the
        generation there, and the KV past what it kept is cut."""
        gen = slot.gen
        k, gen.forcing = gen.forcing, 0
        first = gen.logits_at if gen.req.logprobs is not None else gen.logits_at - k
        slot.advanced(tokens[:1])
        for j in range(k + 1):
            gen.logits_at = first + j
            self._sample_or_fail(slot)
            if slot.gen is not gen or j == k:
                break
            slot.advanced([tokens[j + 1]])
        if slot.gen is not gen:
            self.llama.seq_rm(slot.index, len(slot.tokens), -1)

    def _take_choices(self, gen: Generation) -> list[Generation]:
        choices, gen.choices = gen.choices, []
        return choices

    def _fork(self, source: Slot, slot: Slot) -> None:
        """Another choice of `source`'s request: the prompt's KV copied into its slot, then it samples
        from the same logits. Where llama.cpp cannot copy (recurrent models), it decodes the prompt."""
        prompt = source.gen.prompt
        if self.placement.keep_prefix(slot.index, source.index, len(prompt)) < len(prompt):
            slot.occupy(slot.gen, 0)
            return
        slot.forked(source.gen.cached)
        slot.gen.logits_at = source.gen.logits_at
        self._sample_or_fail(slot)

    def _score_prompt(self, gen: Generation, tokens: list[int]) -> None:
        """Each prompt token's logprob, from the logits of the position before it."""
        k = gen.req.logprobs or 0
        if gen.n_past == 0:
            gen.prompt_scores.append(TokenLogprob(self.llama.piece(gen.prompt[0]), None, ()))
        for j in range(len(tokens)):
            pos = gen.n_past + j + 1
            if pos < len(gen.prompt):
                gen.prompt_scores.append(self._logprob(gen.scored_from + j, gen.prompt[pos], k))

    def _logprob(self, row: int, token: int, k: int) -> TokenLogprob:
        lp, top = logprobs_at(self.llama, row, token, k)
        return TokenLogprob(self.llama.piece(token), lp, tuple((self.llama.piece(t), v) for t, v in top))

    def _sample_or_fail(self, slot: Slot) -> None:
        try:
            self._sample(slot)
        except NoValidToken as exc:
            self._fail(slot, bad_input(f"The request's grammar cannot be satisfied: {exc}.", "grammar",
                                       "grammar_unsatisfiable"))
        except Exception:  # noqa: BLE001 - fail this request, keep serving the others
            log.exception("sampling failed for %s", slot.gen.request_id)
            self._fail(slot, internal("Sampling failed for this request."))

    def _sample(self, slot: Slot) -> None:
        gen = slot.gen
        reasoning = gen.reasoning
        if reasoning is not None and not gen.forced and reasoning.due():
            gen.forced = reasoning.closing_tokens()
            if not gen.sampler.accepts(gen.forced):
                # A grammar of the request's own writes this reasoning and refuses its close: the budget ends the
                # reply, as max_tokens would.
                gen.forced = []
                self._finish(slot, "length")
                return
        if gen.forced:
            token = gen.forced.pop(0)
            gen.sampler.take(token)
        else:
            token = gen.sampler.sample(gen.logits_at)
        gen.generated += 1
        if self.llama.is_eog(token):
            self._finish(slot, "stop")
            return
        gen.last_token = token
        gen.pending_tokens += 1
        if gen.req.return_tokens:
            gen.token_ids.append(token)
        if gen.req.logprobs is not None:
            gen.pending_logprobs.append(self._logprob(gen.logits_at, token, gen.req.logprobs))
        text = gen.decoder.decode(self.llama.piece(token))
        if reasoning is not None and reasoning.took(text) and gen.sampler.deferred:
            gen.sampler.resume()  # the answer starts: its grammar applies from the next token
        out, matched = gen.stop.feed(text)
        if out:
            self._text(gen, out)
        if matched:
            self._finish(slot, "stop", flush=False)
        elif gen.generated >= gen.max_tokens or gen.n_past + 1 >= self.n_ctx:
            self._finish(slot, "length")

    # -- leaving a slot --------------------------------------------------------------------------
    def _finish(self, slot: Slot, reason: str, flush: bool = True) -> None:
        gen = slot.gen
        if flush:
            tail = gen.stop.feed(gen.decoder.decode(b"", final=True))[0] + gen.stop.flush()
            if tail:
                self._text(gen, tail)
        # Free the slot before telling the client, so a follow-up request finds it free.
        self._release(slot, keep_cache=True)
        self.placement.finished(slot)
        self._out(gen, Finished(finish_reason=reason, prompt_tokens=len(gen.prompt),
                                completion_tokens=gen.generated, cached_tokens=gen.cached, index=gen.index,
                                token_ids=tuple(gen.token_ids),
                                stop_sequence=gen.stop.matched,
                                reasoning_tokens=gen.reasoning.tokens if gen.reasoning is not None else 0))

    def _text(self, gen: Generation, text: str) -> None:
        """Released text, with the tokens (and their logprobs) held back until now."""
        self._out(gen, Text(text, gen.pending_tokens, tuple(gen.pending_logprobs), gen.index))
        gen.pending_tokens = 0
        gen.pending_logprobs.clear()

    def _fail(self, slot: Slot, err: EngineError) -> None:
        gen = slot.gen
        self._release(slot, keep_cache=False)
        for choice in self._take_choices(gen):  # choices still waiting for this prompt go too
            self._release(self.slots[choice.slot], keep_cache=False)
        self._out(gen, Failed(err))

    def _release(self, slot: Slot, keep_cache: bool) -> None:
        if slot.gen.sampler is not None:
            slot.gen.sampler.free()
            slot.gen.sampler = None
        release_all(slot.gen.images)
        slot.vacate(keep_cache)
        if not keep_cache:
            self.llama.seq_rm(slot.index, 0, -1)

    def _fail_all(self, err: EngineError) -> None:
        with self._cv:
            for gen in (*self._waiting, *(g for g in self._admitting if g.slot < 0)):
                gen.free()
                self._out(gen, Failed(err))
            self._waiting.clear()
            self._admitting = []
            for slot in self.slots:
                if slot.gen is not None:
                    gen = slot.gen
                    self._release(slot, keep_cache=True)  # the context may be gone: no KV edits
                    self._out(gen, Failed(err))
        self._flush()
