"""Continuous batching over llama.cpp sequence slots, driven by one background thread.

Each step decodes one batch that holds the next token of every generating sequence plus
chunks of newly admitted prompts, then samples each sequence with its own sampler chain.
Requests join and leave between steps; a finished, failed or cancelled request frees its slot
at once. A free slot keeps its tokens' KV so a later prompt with the same prefix reuses it.

The lock guards only the queue (waiting requests, cancellations, closing): `submit`, `cancel` and
`stats` never wait for slow work. A request's slow setup (tokenizing, its sampler chains with their
grammar) is done by `prepare`, on the caller's thread, before it is queued; the decode thread takes
waiting requests out under the lock and places them in the KV (copies, prompt-cache restores and
saves) after releasing it. Slots belong to the decode thread alone.

Waiting requests take idle slots first come, first served, with bounded backfill; when several keys
(tenants) wait, the next slot goes to the one holding the fewest slots for its weight (admission.py,
`fair_share`).

The engine knows nothing of asyncio: a step's events go out in one call of `publish`
(stream.py's publisher hands them to each event loop in one wake-up).

Speculative decoding (speculation.py), where the model has it on: a generating sequence puts its last token
and the drafts proposed for it into the same batch, with logits at every row; `_verify` keeps the drafts the
request's own sampler picks (its output unchanged), and cuts the rest out of the KV.

LoRA adapters (lora.py) apply to the whole context, so a step decodes only the sequences of one adapter
set, the one on the context (`_adapter_turn`): while one set has work it keeps the context; when several
do, each set holds it for ADAPTER_TURN_STEPS steps at most, then the set that has waited longest since its
last turn takes it (round robin: none starves, and a switch, which makes llama.cpp reserve its graph
again, costs one per turn rather than one per step). Slots and the prompt cache reuse KV only within one
adapter set (Generation.kv_scope).
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

from ..config.settings import ModelSpec, place
from . import hardware, prompt_marks
from .admission import BACKFILL_S, RecentTenants, admissible, held_back, in_share_order
from .constraint import MaskWorker, grammar_tokenizer
from .decode_thread import DecodeThread
from .errors import ContextExceeded, EngineError, bad_input, internal
from .events import Event, Failed, Finished, PromptLogprobs, Started, Text, TokenLogprob
from .llama import (Batch, EmbdBatch, LlamaModelContext, NoValidToken, SamplerChain, decode,
                    decode_embd, logprobs_at)
from . import lora
from .lora import BASE, AdapterSet, LoraAdapter
from .params import IMAGE_MARKER, GenerationRequest, ImageInput
from .prompt_cache import Entry, PromptCache
from .slots import Generation, Sink, Slot, SlotState, common_prefix
from .speculation import DraftAsk, DraftBudget, Drafter, NgramDrafter, SpecCounters, StepCost
from .stop import StopMatcher
from .vision import ImageSpan, Projector, image_boundary, image_prompt, release_all

log = logging.getLogger("llamaray.engine")

MIN_COPY_TOKENS = 16
# Steps one adapter set decodes before another set with work takes the context. A switch made the next
# step take about twice as long on the bundled model (llama.cpp reserves its graph again: 14 ms against 7).
ADAPTER_TURN_STEPS = 4

Publish = Callable[[list[tuple[Sink, Event]]], None]


_TENANT = attrgetter("req.tenant")


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
            kv_unified=spec.kv_unified,
            extra_buffers=hardware.use_extra_buffers(spec.cpu_extra_buffers, hardware.system_info()),
        )
        self.n_ctx = spec.n_ctx
        self.projector: Projector | None = None
        if spec.mmproj_path:
            try:
                self.projector = Projector(spec.mmproj_path, self.llama, spec.n_threads_batch, spec.n_gpu_layers != 0)
            except BaseException:
                self.llama.close()
                raise
        self._publish = publish
        self._batch = Batch(max(spec.n_batch, spec.n_seq_max))
        self._waiting: deque[Generation] = deque()
        self._admitting: list[Generation] = []  # out of the queue, not yet in their slots
        self._cancelled: set[str] = set()
        self.backfill_s = BACKFILL_S  # admission.py: how long a blocked request lets smaller ones pass
        self.fair_share = spec.fair_share  # admission.py: keys share the slots by weight when they compete
        self._recent = RecentTenants()  # admission.py: the keys that used the model lately
        self._slots = [Slot(i) for i in range(spec.n_seq_max)]
        self._prompt_cache = PromptCache(int(spec.prompt_cache_mib * (1 << 20)))
        self._outbox: list[tuple[Sink, Event]] = []
        # Slots left idle with their KV since the engine last had nothing to do: it goes to the prompt cache then,
        # so the next request's admission (which would save it first, before overwriting) finds it saved.
        self._idle_kv: list[int] = []
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
        # LoRA adapters: loaded by name; unloaded ones wait in _retired until no generation holds them.
        self._adapters: dict[str, LoraAdapter] = {}
        self._retired: list[LoraAdapter] = []
        self._base_tensors: lora.BaseTensors | None = None
        self._on_context: AdapterSet = BASE  # the set llama.cpp applies now (decode thread)
        self._turn_steps = 0                 # steps the set on the context has had in its turn
        self._last_turn: dict[AdapterSet, int] = {}  # set -> the step its last turn began
        self.adapter_switches = 0
        # Speculative decoding: off where the model's config leaves it off, and for recurrent or hybrid
        # models, whose state cannot be cut back past rejected drafts.
        self.speculative = spec.speculative if spec.speculative is not None and self.llama.can_cut_back else None
        self._drafter: Drafter | None = None
        self.step_cost = StepCost.flat()
        if self.speculative is not None:
            try:
                self._drafter = self._load_drafter(spec)
            except BaseException:
                self._batch.free()
                self.close_models()
                raise
            if self.speculative.adaptive:
                self.step_cost = self._measure_step_cost()
        self.spec_counters = SpecCounters()

    # -- called from any thread ------------------------------------------------------------------
    def prepare(self, req: GenerationRequest, sink: Sink) -> Generation:
        """Tokenize, check limits, build each choice's sampler chain (its grammar parsed); raises an
        engine error (bad input, context exceeded) before anything is queued. Slow for long prompts and large grammars: call it
        off the event loop (stream.py does). With n > 1 the first choice carries the others: they
        take slots together and share its prompt's KV."""
        if req.n > len(self._slots):
            raise bad_input(f"`n` is {req.n}; model `{self.spec.id}` generates at most {len(self._slots)} "
                            f"choices at once (its n_seq_max).", "n", "n_too_large")
        self._check_images(req)
        adapters = lora.resolve(self.spec.id, self._adapters, req.adapters) if req.adapters else BASE
        limit = req.max_tokens  # the request's, its default applied while planning (None: the context left)
        self._check_continuation(req.continue_tokens)
        # What the prompt's bytes already prove, before the work of tokenizing it.
        at_least = self._fewest_tokens(req.prompt) + len(req.continue_tokens)
        self._check_fits(at_least, limit, exact=False)
        self._check_logprobs(req, at_least, limit, exact=False)
        tokens, images = self._tokenize(req)
        prompt = tokens + list(req.continue_tokens)
        try:
            self._check_fits(len(prompt), limit, exact=True)
            self._check_logprobs(req, len(prompt), limit, exact=True)
            self._check_image_places(images, len(prompt))
        except BaseException:
            release_all(images)
            raise

        def choice(index: int) -> Generation:
            return Generation(req=req, sink=sink, prompt=prompt, stop=StopMatcher(req.stop), index=index,
                              max_tokens=limit if limit is not None else self.n_ctx - len(prompt), images=images)

        first = choice(0)
        first.choices = [choice(i) for i in range(1, req.n)]
        for g in (first, *first.choices):
            g.adapters = adapters
            g.draft = self._draft_budget(req)
            g.drafter = self._drafter.sequence() if g.draft is not None and self._drafter is not None else None
        try:
            for g in (first, *first.choices):
                g.sampler = self._sampler_for(req, g.index)
        except BaseException as exc:
            first.free()
            if not isinstance(exc, Exception):
                raise
            if isinstance(exc, EngineError):
                raise
            log.exception("could not build the sampler for %s", req.request_id)
            raise internal("Could not set up sampling for this request.") from None
        return first

    def _draft_budget(self, req: GenerationRequest) -> DraftBudget | None:
        """A generation's draft length, None where it never drafts: speculation off for the model or by the
        request, or a request's n_max of 0."""
        if self.speculative is None or not req.speculative:
            return None
        if self.speculative.type == "draft" and req.images:
            return None  # the draft model would read an image's positions as its placeholder tokens
        n_max = req.spec_n_max if req.spec_n_max is not None else self.speculative.n_max
        n_min = req.spec_n_min if req.spec_n_min is not None else self.speculative.n_min
        return DraftBudget(n_max, n_min, self.speculative.adaptive) if n_max > 0 else None

    def _load_drafter(self, spec: ModelSpec) -> Drafter:
        if self.speculative.type != "draft":
            return NgramDrafter(self.speculative.ngram_max, self.speculative.ngram_min)
        from .draft_model import DraftModel

        draft = DraftModel(self.speculative.draft_path, target_vocab=self.llama.n_vocab, n_ctx_per_seq=spec.n_ctx,
                           n_seq_max=spec.n_seq_max, n_batch=spec.n_batch, n_threads=spec.n_threads,
                           n_threads_batch=spec.n_threads_batch, n_gpu_layers=spec.n_gpu_layers,
                           kv_unified=spec.kv_unified, extra_buffers=hardware.use_extra_buffers(
                               spec.cpu_extra_buffers, hardware.system_info()))
        if self.speculative.adaptive:
            try:
                draft.measure()
            except BaseException:
                draft.close()
                raise
        log.info("model %s: draft model %s loaded", spec.id, self.speculative.draft_path)
        return draft

    def _measure_step_cost(self) -> StepCost:
        """The decode time of a step by its rows (logits at each, as a verification has), timed on this context
        before it serves (about 0.5 s on 2 CPU cores, milliseconds on a GPU): what an adaptive draft weighs
        its expected gain against. Where it cannot be timed, rows are taken to cost as a token each, and
        adaptive drafting then verifies nothing."""
        batch = self._batch
        most = min(batch.capacity, self.n_ctx - 1, self.speculative.max_sequences * (self.speculative.n_max + 1))
        sizes = sorted({min(n, most) for n in (1, 2, 4, 8, 16, 32, 64) if n <= max(most, 1)} | {max(most, 1)})
        token = self.llama.tokenize_prompt(" the", False)[-1]

        def decode_rows(n: int) -> None:
            batch.clear()
            for pos in range(n):
                batch.add(token, pos, 0, True)
            try:
                if decode(self.llama, batch) != 0:
                    raise RuntimeError(f"llama_decode failed on {n} rows")
            finally:
                self.llama.seq_rm(0, 0, -1)
                batch.clear()

        try:
            cost = StepCost.measure(decode_rows, sizes)
        except Exception:  # noqa: BLE001 - speculation stays safe (off in effect), the model serves
            log.exception("model %s: could not time its decode steps; adaptive drafting verifies nothing",
                          self.spec.id)
            return StepCost({1: 1.0, 2: 2.0})
        log.info("model %s: decode step by rows (ms) %s", self.spec.id,
                 {n: round(s * 1e3, 2) for n, s in cost.as_dict().items()})
        return cost

    def discard(self, gen: Generation) -> None:
        """A prepared generation that will not be submitted: its samplers and images freed. Any thread."""
        gen.free()

    def _check_images(self, req: GenerationRequest) -> None:
        if not req.images:
            return
        if self.projector is None:
            raise bad_input(f"Model `{self.spec.id}` takes no images (it has no multimodal projector, "
                            f"`mmproj_path`).", "images", "images_unsupported")
        if req.prompt_logprobs:
            # Image positions have no token to score, and their rows' logits were never computed.
            raise bad_input("Prompt logprobs (`echo`) are not available for prompts with images.",
                            "prompt_logprobs", "images_unsupported")

    def _tokenize(self, req: GenerationRequest) -> tuple[list[int], list[ImageSpan]]:
        """The prompt's tokens, and its image spans when it has images (their pixels preprocessed)."""
        if not req.images:
            return self.llama.tokenize_prompt(req.prompt) or [self.llama.bos], []
        try:
            return image_prompt(self.llama, self.projector, req.prompt, req.images)
        except ValueError as exc:  # markers and images that do not pair up: the renderer's bug
            log.error("request %s: %s", req.request_id, exc)
            raise internal("The prompt's images do not match its image places.") from None
        except RuntimeError:
            log.exception("request %s: the projector could not take its images", req.request_id)
            raise internal("The model's projector could not read this request's images.") from None

    def _check_image_places(self, images: list[ImageSpan], prompt_tokens: int) -> None:
        """Each image decodes in one llama_decode where its rows must see each other (non-causal), and
        never last: the prompt's last position gives the logits to sample from."""
        n_ubatch = min(self.spec.n_batch, 512)
        for span in images:
            if span.non_causal and span.n_tokens > n_ubatch:
                raise bad_input(f"An image of this request takes {span.n_tokens} positions; model "
                                f"`{self.spec.id}` decodes at most {n_ubatch} at once (raise its n_batch).",
                                "images", "image_too_large")
        if images and images[-1].end >= prompt_tokens:
            raise bad_input("The prompt ends with an image; the model needs text after it.", "images", "image_at_end")

    def _fewest_tokens(self, prompt: str) -> int:
        """The fewest tokens `prompt` can make (0: not known for this vocabulary): its UTF-8 bytes over
        the longest token piece, our content marks not counted."""
        longest = self.llama.longest_piece
        if not longest:
            return 0
        size = len(prompt) if prompt.isascii() else len(prompt.encode("utf-8", "surrogatepass"))
        size -= len(IMAGE_MARKER) * prompt.count(IMAGE_MARKER)  # an image's tokens are no text (one at least)
        marks = prompt.count(prompt_marks.OPEN) + prompt.count(prompt_marks.CLOSE)
        if marks:  # marks (3 bytes each) and their JSON-escaped forms (\\ufdd0, 6 bytes) are no text
            size -= 3 * marks + 6 * (prompt.count("\\ufdd") + prompt.count("\\uFDD"))
        return -(-max(0, size) // longest)

    def _check_fits(self, prompt_tokens: int, limit: int | None, exact: bool) -> None:
        if prompt_tokens >= self.n_ctx or (limit is not None and prompt_tokens + limit > self.n_ctx):
            raise ContextExceeded(self.n_ctx, prompt_tokens, limit, at_least=not exact)

    def _check_continuation(self, tokens: list[int]) -> None:
        """Token ids to continue from reach llama.cpp as they are: one outside the vocabulary aborts it."""
        n_vocab = self.llama.n_vocab
        for i, token in enumerate(tokens):
            if not 0 <= token < n_vocab:
                raise bad_input(f"Token id {token} (continue_tokens[{i}]) is not in the vocabulary of model "
                                f"`{self.spec.id}`.", "continue_tokens", "invalid_token")

    def _check_logprobs(self, req: GenerationRequest, prompt_tokens: int, limit: int | None, exact: bool) -> None:
        """The logprob entries this generation may make, within its share of limits.max_logprob_entries:
        each is a TokenLogprob with `logprobs` alternatives, built, pickled and sent as JSON."""
        share = req.max_logprob_entries
        if share is None or (req.logprobs is None and not req.prompt_logprobs):
            return
        per = 1 + (req.logprobs or 0)
        scored = prompt_tokens if req.prompt_logprobs else 0
        generated = 0
        if req.logprobs is not None and limit is not None:
            generated = limit
        elif req.logprobs is not None and exact:  # the context left (from a bound on the prompt: unknown)
            generated = max(0, self.n_ctx - prompt_tokens)
        entries = (scored + generated * req.n) * per
        if entries <= share:
            return
        parts = []
        if scored:
            parts.append(f"{'at least ' if not exact else ''}{scored} prompt tokens scored")
        if generated:
            parts.append(f"up to {generated} generated tokens x {req.n} choices")
        raise bad_input(
            f"This request may produce {'at least ' if not exact else ''}{entries} logprob entries "
            f"({' + '.join(parts)}, each with 1 + {req.logprobs or 0} alternatives); at most {share} are allowed "
            f"for it (limits.max_logprob_entries, shared over the request's prompts). Ask for fewer `logprobs`, "
            f"a lower `max_tokens`, fewer choices or shorter prompts.", "logprobs", "logprobs_too_large")

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """`text`'s tokens as `prepare` counts a prompt (content marks honoured). Any thread."""
        return self.llama.tokenize_prompt(text, add_special)

    def count_prompt(self, prompt: str, images: list[ImageInput]) -> int:
        """A rendered prompt's tokens as `prepare` counts them, its images' positions included (the
        projector's preprocessing only: nothing is encoded). Any thread."""
        probe = GenerationRequest(request_id="count", prompt=prompt, images=images)
        self._check_images(probe)
        tokens, spans = self._tokenize(probe)
        release_all(spans)
        return len(tokens)

    def detokenize(self, tokens: list[int]) -> str:
        """The text of token ids; an id outside the vocabulary is bad input naming its place. Any thread."""
        n_vocab = self.llama.n_vocab
        for i, token in enumerate(tokens):
            if not 0 <= token < n_vocab:
                raise bad_input(f"Token id {token} (tokens[{i}]) is not in the vocabulary of model "
                                f"`{self.spec.id}` (ids 0 to {n_vocab - 1}).", f"tokens[{i}]", "invalid_token")
        return self.llama.detokenize(tokens)

    # -- LoRA adapters (any thread) ----------------------------------------------------------------
    def load_adapter(self, name: str, path: str) -> LoraAdapter:
        """Load the LoRA adapter GGUF at `path` for this engine's model, as `name`: requests then name it in
        GenerationRequest.adapters. Checked against the model first: lora.AdapterMismatch (nothing loaded) for
        an adapter made for another base, naming both. Slow (reads the file): call it off the event loop.
        A name already loaded is a ValueError (unload it first)."""
        if not name:
            raise ValueError("an adapter needs a name")
        with self._cv:
            if name in self._adapters:
                raise ValueError(f"model `{self.spec.id}` already has an adapter named `{name}`")
        if self._base_tensors is None:
            self._base_tensors = lora.BaseTensors.read(self.spec.id, self.spec.path)
        adapter = lora.load_adapter(self.llama, self._base_tensors, name, path)
        with self._cv:
            if name not in self._adapters and not self._closing:
                self._adapters[name] = adapter
                log.info("model %s: adapter %s loaded from %s", self.spec.id, name, path)
                return adapter
        adapter.free()  # never set on the context: free here
        raise ValueError(f"model `{self.spec.id}` already has an adapter named `{name}`" if not self._closing
                         else "the engine is closing")

    def unload_adapter(self, name: str) -> bool:
        """Stop accepting requests for adapter `name` (False: none loaded); llama.cpp's adapter is freed on
        the decode thread once no queued or running generation uses it."""
        with self._cv:
            adapter = self._adapters.pop(name, None)
            if adapter is None:
                return False
            self._retired.append(adapter)
            self._cv.notify()
        return True

    def adapter_names(self) -> list[str]:
        with self._cv:
            return sorted(self._adapters)

    def submit(self, gen: Generation) -> None:
        """Queue a prepared generation (the engine owns it from here). Any thread."""
        with self._cv:
            gone = next((a for a in gen.adapters.adapters if self._adapters.get(a.name) is not a), None)
            if gone is None and self.broken is None:
                gen.queued_at = time.monotonic()
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
            return {"running": self.active, "waiting": self.waiting, "slots": len(self._slots),
                    "steps": self.steps, "tokens_decoded": self.tokens_decoded, "healthy": self.healthy(),
                    "prompt_cache": self._prompt_cache.stats(),
                    "adapters": sorted(self._adapters), "adapter_switches": self.adapter_switches,
                    "spec_decode": self.spec_counters.as_dict(),
                    **({"spec_step_ms": {n: round(t * 1e3, 3) for n, t in self.step_cost.as_dict().items()}}
                       if self.speculative is not None else {}),
                    **({"images_held": self.projector.held} if self.projector is not None else {})}

    @property
    def waiting(self) -> int:
        """Requests submitted and not yet in a slot (read without the lock: a hint)."""
        return len(self._waiting) + len(self._admitting)

    @property
    def active(self) -> int:
        """Occupied slots (read without the lock: a hint, not an exact count)."""
        return sum(slot.gen is not None for slot in self._slots)

    def close(self) -> None:
        super().close()
        self._masks.close()
        self._batch.free()
        if self.llama.ctx is not None and not self._thread.is_alive():
            self._free_adapters([*self._adapters.values(), *self._retired])
        self._adapters, self._retired = {}, []
        self.close_models()

    def close_models(self) -> None:
        """The draft model, the projector and the model freed (also when the engine fails to start)."""
        close_draft = getattr(self._drafter, "close", None) if hasattr(self, "_drafter") else None
        if close_draft is not None:
            close_draft()
        if self.projector is not None:
            self.projector.close()
        self.llama.close()

    # -- the decode thread -----------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not (self._closing or self._waiting or self.active or self._cancelled or self._retired):
                    if self._idle_kv:
                        break
                    self._cv.wait()
                if self._closing:
                    return
                cancelled, self._cancelled = self._cancelled, set()
                dropped = self._unqueue(cancelled)
                self._admitting = self._take_admissible()
                unused = self._unused_retired()
            # Without the lock from here: KV edits, copies and saves never hold up the callers.
            for gen in dropped:
                gen.free()
            self._release_cancelled(cancelled)
            self._free_adapters(unused)
            self._admit(self._admitting)
            self._admitting = []
            self._flush()
            if not self.active and self._idle_kv:
                self._save_idle(self._idle_kv.pop())
            if self.active:
                started = time.perf_counter()
                self._step()
                self._flush()
                elapsed = time.perf_counter() - started
                self.step_s = elapsed if self.step_s == 0.0 else 0.8 * self.step_s + 0.2 * elapsed

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
        for slot in self._slots:
            if slot.gen is not None and slot.gen.request_id in ids:
                self._release(slot, keep_cache=False)

    def _take_admissible(self) -> list[Generation]:
        """Waiting requests that idle slots can take now, out of the queue (under the lock)."""
        if not self._waiting:
            return []
        idle = sum(slot.state is SlotState.IDLE for slot in self._slots)
        if not idle:
            return []
        now, waiting = time.monotonic(), self._waiting
        held, reserve = Counter(), 0
        if self.fair_share:
            held = Counter(s.gen.req.tenant for s in self._slots if s.gen is not None)
            waiting = in_share_order(self._waiting, held)
            # A slot kept from keys already running something, for a key that used the model lately and is not in
            # line now (it may be back any moment).
            reserve = held_back(self._recent.recent(now), held, waiting, len(self._slots))
        taken = admissible(waiting, idle, now, self.backfill_s, reserve=reserve, tenant_of=_TENANT, holding=held)
        if taken:
            chosen = set(map(id, taken))
            self._waiting = deque(g for g in self._waiting if id(g) not in chosen)
        return taken

    # -- admission: a place in the KV ------------------------------------------------------------
    def _admit(self, admitted: list[Generation]) -> None:
        """Requests taken out of the queue into idle slots (enough of them were counted): the first
        choice where its prompt's longest reusable prefix is, its other choices into the lowest idle slots."""
        for gen in admitted:
            # Scoring the prompt needs logits at every prompt position: nothing of it is reused. Nor is
            # anything for a request that asked for none (cache_prompt false: reproducible replies).
            reuse = gen.req.cache_prompt and not gen.req.prompt_logprobs
            slot, reused = self._place(gen.prompt, gen.kv_scope, reuse=reuse, images=gen.images)
            slot.occupy(gen, reused)
            for g in gen.choices:
                fork = self._lowest_idle()
                self._save_to_cache(fork, keep=0)
                fork.occupy(g, 0, SlotState.FORKING)
            for g in (gen, *gen.choices):
                self._out(g, Started(prompt_tokens=len(g.prompt), cached_tokens=reused, index=g.index,
                                     queued_s=time.monotonic() - gen.queued_at))

    def _sampler_for(self, req: GenerationRequest, index: int = 0) -> SamplerChain:
        params = replace(req.sampling, seed=req.choice_seed(index)) if index else req.sampling
        sampler = SamplerChain(self.llama, params, self.grammar_tokenizer() if params.grammar else None,
                               keep_logits=req.logprobs is not None)
        if sampler.advance(req.continue_tokens):
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

    def _place(self, prompt: list[int], scope: str, reuse: bool = True,
               images: list[ImageSpan] | None = None) -> tuple[Slot, int]:
        """An idle slot for `prompt`, its KV holding the longest reusable prefix; (slot, tokens kept).

        The slot is the lowest-numbered idle one, so busy slots stay packed: with a KV stream per slot,
        llama.cpp decodes only runs of consecutive sequence ids together, and 8 decoding sequences
        spread over 16 slots took twice as long a step as 8 packed ones. An idle slot already holding
        a real prefix (MIN_COPY_TOKENS more) is taken instead: recomputing or copying that prefix costs
        more than a gap. The slot's own prefix is kept; a longer one is copied in from another slot (a
        busy slot's earlier positions never change) or restored from the prompt cache in host memory,
        after what the slot held went to that cache. At least the last prompt token is always
        recomputed, so there are logits to sample from. Only KV computed in the prompt's cache `scope`
        is reused (kept, copied or restored): other scopes' prefixes count as nothing. A prefix never ends
        inside one of the prompt's `images` (vision.py)."""
        images = images or []
        prefix = {slot.index: image_boundary(common_prefix(slot.tokens, prompt), images)
                  if reuse and slot.scope == scope else 0 for slot in self._slots}
        target = self._lowest_idle()
        best_idle = max((s for s in self._slots if s.state is SlotState.IDLE), key=lambda s: prefix[s.index])
        if prefix[best_idle.index] - prefix[target.index] >= MIN_COPY_TOKENS:
            target = best_idle
        source = max(self._slots, key=lambda s: (prefix[s.index], s is target))
        if prefix[source.index] - prefix[target.index] < MIN_COPY_TOKENS:
            source = target  # copying a stream is only worth it for a real prefix
        cached, held = self._prompt_cache.best(prompt, scope) if reuse else (None, 0)
        held = image_boundary(held, images)
        if cached is not None and held - prefix[source.index] >= MIN_COPY_TOKENS:
            self._save_to_cache(target, keep=0)
            kept = self._restore(target.index, cached, min(held, len(prompt) - 1))
            if kept:
                return target, kept
            target.tokens = []  # a refused restore leaves the slot's KV empty
            if source is target:
                return target, 0
        keep = min(prefix[source.index], len(prompt) - 1)
        self._save_to_cache(target, keep=keep if source is target else 0)
        return target, self._keep_prefix(target.index, source.index, keep)

    def _lowest_idle(self) -> Slot:
        return next(slot for slot in self._slots if slot.state is SlotState.IDLE)

    def _save_to_cache(self, slot: Slot, keep: int) -> None:
        """Before `slot`'s KV past `keep` tokens is overwritten: store it in the prompt cache."""
        if len(slot.tokens) - keep >= MIN_COPY_TOKENS and self._prompt_cache.worth_keeping(slot.tokens, slot.scope):
            state, size = self.llama.seq_state(slot.index)
            if size:
                self._prompt_cache.put(slot.tokens, state, size, slot.scope)

    def _save_idle(self, index: int) -> None:
        """An idle slot's KV into the prompt cache while no request waits or runs (one slot a turn of the loop, so
        a request that comes meanwhile waits for one save at most, as it would at its admission)."""
        slot = self._slots[index]
        if slot.state is SlotState.IDLE and not self._waiting:
            self._save_to_cache(slot, keep=0)

    def _restore(self, slot: int, entry: Entry, keep: int) -> int:
        """`entry`'s KV into `slot`, cut to its first `keep` tokens; the number kept (0: refused)."""
        self.llama.seq_rm(slot, 0, -1)
        if self.llama.set_seq_state(slot, entry.state, entry.size) and self.llama.seq_rm(slot, keep, -1):
            self._prompt_cache.hits += 1
            return keep
        self.llama.seq_rm(slot, 0, -1)
        return 0

    def _keep_prefix(self, slot: int, source: int, reuse: int) -> int:
        """Make `slot`'s KV hold the first `reuse` prompt tokens (kept, or copied from `source`);
        the number actually kept. A KV edit llama.cpp refuses (recurrent or hybrid models cannot
        cut a sequence at a position) means the prefix is recomputed instead: 0."""
        if source == slot:
            if self.llama.seq_rm(slot, reuse, -1):  # keep the shared prefix, drop the rest
                return reuse
        else:
            # In one unified pool the cells are shared; across per-slot streams llama.cpp copies
            # only whole streams (a partial copy aborts), so copy it all and trim.
            self.llama.seq_rm(slot, 0, -1)
            if reuse > 0 and self.spec.kv_unified:
                self.llama.seq_cp(source, slot, 0, reuse)
                return reuse
            if reuse > 0:
                self.llama.seq_cp(source, slot, -1, -1)
                if self.llama.seq_rm(slot, reuse, -1):
                    return reuse
        self.llama.seq_rm(slot, 0, -1)  # a whole-sequence removal always succeeds
        return 0

    # -- LoRA adapters on the context (decode thread) ---------------------------------------------
    def _unused_retired(self) -> list[LoraAdapter]:
        """Unloaded adapters no queued, admitted or running generation holds, out of _retired (under the lock)."""
        if not self._retired:
            return []
        held = {id(a) for g in (*self._waiting, *self._admitting, *(s.gen for s in self._slots if s.gen))
                for a in g.adapters.adapters}
        unused = [a for a in self._retired if id(a) not in held]
        self._retired = [a for a in self._retired if id(a) in held]
        return unused

    def _free_adapters(self, adapters: list[LoraAdapter]) -> None:
        """Free llama.cpp's adapters, first taking them off the context if it applies them."""
        if not adapters:
            return
        if any(a in self._on_context.adapters for a in adapters):
            lora.apply(self.llama, BASE)
            self._on_context = BASE
        for adapter in adapters:
            adapter.free()
            log.info("model %s: adapter %s freed", self.spec.id, adapter.name)

    def _in_turn(self, slot: Slot) -> bool:
        """Whether `slot` decodes this step: its generation's adapter set is the one on the context."""
        return slot.gen is not None and slot.gen.adapters == self._on_context

    def _adapter_turn(self) -> None:
        """Put on the context the adapter set this step decodes (the policy: the module's docstring). The
        set on the context keeps it while it alone has work, or for ADAPTER_TURN_STEPS steps when others
        wait; then the set whose last turn began longest ago (never: first, oldest request first) takes it."""
        current = self._on_context
        oldest: dict[AdapterSet, float] = {}
        for slot in self._slots:
            if slot.gen is not None and slot.state in (SlotState.PREFILLING, SlotState.GENERATING):
                aset = slot.gen.adapters
                oldest[aset] = min(oldest.get(aset, slot.gen.queued_at), slot.gen.queued_at)
        self._turn_steps += 1
        if not oldest or (current in oldest and (len(oldest) == 1 or self._turn_steps <= ADAPTER_TURN_STEPS)):
            return
        waiting = [aset for aset in oldest if aset != current]
        nxt = min(waiting, key=lambda aset: (self._last_turn.get(aset, -1), oldest[aset]))
        lora.apply(self.llama, nxt)
        self._on_context = nxt
        self._turn_steps = 1
        self._last_turn = {aset: self._last_turn[aset] for aset in oldest if aset in self._last_turn}
        self._last_turn[nxt] = self.steps
        self.adapter_switches += 1

    # -- one step: build the batch, decode, sample -------------------------------------------------
    def _step(self) -> None:
        self._adapter_turn()
        self._decode_image()
        planned = self._fill_batch()
        if self._batch.n == 0:
            return
        # The grammars' masks for this step's samples, computed while the batch decodes.
        masks = self._masks.start([slot.gen.sampler.constraint for slot, _ in planned
                                   if slot.gen.logits_at >= 0 and slot.gen.sampler is not None
                                   and slot.gen.sampler.constraint is not None]) if self.masks_beside_decode else None
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
        slot = next((s for s in self._slots if s.pending_image() is not None and self._in_turn(s)), None)
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
        generating = [s for s in self._slots if s.state is SlotState.GENERATING and self._in_turn(s)]
        room = batch.capacity - len(generating)  # rows left once each generating sequence has its token
        # Drafting is for sequences in their turn that generate: a prefilling prompt (its images, its scored
        # positions, an n > 1 request's choices not yet forked) decodes as it always does. A large batch is
        # already efficient on its own: there drafts cost more than they give (max_sequences).
        drafting = self._drafter is not None and len(generating) <= self.speculative.max_sequences
        chosen = self._choose_drafts(generating, room) if drafting else {}
        for slot in generating:
            gen = slot.gen
            gen.drafts = chosen.get(slot.index, [])
            tokens = [gen.last_token, *gen.drafts]
            planned.append((slot, tokens))
            self._put(slot, tokens, logits=True)
        for slot in self._slots:
            pending = slot.pending_prompt()[:batch.capacity - batch.n] if self._in_turn(slot) else []
            if pending:
                planned.append((slot, pending))
                self._put(slot, pending, logits=slot.gen.n_past + len(pending) == len(slot.gen.prompt))
        return planned

    def _choose_drafts(self, generating: list[Slot], room: int) -> dict[int, list[int]]:
        """The draft tokens each generating slot verifies this step (by slot index): up to what its n_max, the
        batch's `room`, its max_tokens and its context leave (each row samples one token more), as many as its
        budget finds worth their rows (speculation.py). A costly drafter (a draft model) is asked only for
        sequences whose drafts may pay, and now and then for a short probe. A proposal not verified is watched:
        the tokens generated next measure the acceptance it would have had."""
        cost, sequences, draft_s = self.step_cost, len(generating), self._drafter.seconds_per_token()
        rows = sequences
        asks: list[tuple[Slot, DraftAsk]] = []
        for slot in generating:
            gen = slot.gen
            if gen.draft is None:
                continue
            k = min(gen.draft.n_max, room, gen.max_tokens - gen.generated - 1, self.n_ctx - gen.n_past - 2)
            if k > 0 and not self._drafter.cheap:
                k = gen.draft.tokens_to_ask(k, cost, rows, sequences, draft_s)
            if k > 0:
                asks.append((slot, DraftAsk(slot.index, slot.tokens, gen.last_token, k, gen.drafter)))
        if not asks:
            return {}
        chosen: dict[int, list[int]] = {}
        for (slot, _), proposal in zip(asks, self._drafter.propose_all([ask for _, ask in asks])):
            budget = slot.gen.draft
            n = min(budget.length(len(proposal), cost, rows, sequences, draft_s), room) if proposal else 0
            if n == 0:
                budget.watch(proposal)
                continue
            chosen[slot.index] = proposal[:n]
            room -= n
            rows += n
        return chosen

    def _put(self, slot: Slot, tokens: list[int], logits: bool) -> None:
        """`tokens` into the batch at the slot's next positions; with `logits`, the last one's
        logits are kept and the generation samples from them after the decode. A prompt that is
        scored keeps the logits of every position, and so does a generating sequence with drafts
        (`logits_at` is then its first row)."""
        gen = slot.gen
        every = gen.req.prompt_logprobs and slot.state is SlotState.PREFILLING
        verify = bool(gen.drafts) and slot.state is SlotState.GENERATING
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
        if gen.drafts:
            self._verify(slot, tokens)
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
                    self._finish(self._slots[choice.slot], "length")
                return
            for choice in self._take_choices(gen):
                self._fork(slot, self._slots[choice.slot])
        self._sample_or_fail(slot)
        if gen.draft is not None and slot.gen is gen:
            gen.draft.generated(gen.last_token)

    def _verify(self, slot: Slot, tokens: list[int]) -> None:
        """A generating sequence decoded with drafts (`tokens` is [last token, drafts...], logits at each row):
        row j is sampled with the request's own sampler (grammar, logit bias, penalties, its RNG), exactly
        as the step after accepting drafts 1..j would have sampled it; the token is emitted through the
        per-token bookkeeping of `_sample`; if it is the next draft, that draft is accepted and row j+1 is
        sampled, otherwise the sampled token is this step's last. The drafter is deterministic given the
        tokens so far, so each emitted token is drawn from the target's distribution given the tokens before
        it: the output distribution is the model's own (greedy: its greedy tokens), and a seeded request
        draws its RNG once per emitted token, as without drafts. The rejected drafts' KV is then cut."""
        gen = slot.gen
        drafts, gen.drafts = gen.drafts, []
        first = gen.logits_at
        slot.advanced(tokens[:1])
        accepted = 0
        for j in range(len(drafts) + 1):
            gen.logits_at = first + j
            self._sample_or_fail(slot)
            if slot.gen is not gen or j == len(drafts) or gen.last_token != drafts[j]:
                break  # finished (stop, end of generation, a limit), failed, or the draft was not picked
            slot.advanced([drafts[j]])
            accepted += 1
        c = self.spec_counters
        c.drafts, c.draft_tokens, c.accepted_tokens = c.drafts + 1, c.draft_tokens + len(drafts), \
            c.accepted_tokens + accepted
        gen.draft.verified(len(drafts), accepted)
        if accepted < len(drafts):
            # The KV past what the slot holds (its tokens: kept even when the request ended) is rejected drafts.
            self.llama.seq_rm(slot.index, len(slot.tokens), -1)

    def _take_choices(self, gen: Generation) -> list[Generation]:
        choices, gen.choices = gen.choices, []
        return choices

    def _fork(self, source: Slot, slot: Slot) -> None:
        """Another choice of `source`'s request: the prompt's KV copied into its slot, then it samples
        from the same logits. Where llama.cpp cannot copy (recurrent models), it decodes the prompt."""
        prompt = source.gen.prompt
        if self._keep_prefix(slot.index, source.index, len(prompt)) < len(prompt):
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
        out, matched = gen.stop.feed(gen.decoder.decode(self.llama.piece(token)))
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
        if len(slot.tokens) >= MIN_COPY_TOKENS and slot.index not in self._idle_kv:
            self._idle_kv.append(slot.index)
        self._out(gen, Finished(finish_reason=reason, prompt_tokens=len(gen.prompt),
                                completion_tokens=gen.generated, cached_tokens=gen.cached, index=gen.index,
                                token_ids=tuple(gen.token_ids) if reason == "length" else (),
                                stop_sequence=gen.stop.matched))

    def _text(self, gen: Generation, text: str) -> None:
        """Released text, with the tokens (and their logprobs) held back until now."""
        self._out(gen, Text(text, gen.pending_tokens, tuple(gen.pending_logprobs), gen.index))
        gen.pending_tokens = 0
        gen.pending_logprobs.clear()

    def _fail(self, slot: Slot, err: EngineError) -> None:
        gen = slot.gen
        self._release(slot, keep_cache=False)
        for choice in self._take_choices(gen):  # choices still waiting for this prompt go too
            self._release(self._slots[choice.slot], keep_cache=False)
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
            for slot in self._slots:
                if slot.gen is not None:
                    gen = slot.gen
                    self._release(slot, keep_cache=True)  # the context may be gone: no KV edits
                    self._out(gen, Failed(err))
        self._flush()
