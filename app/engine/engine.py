"""Continuous batching over llama.cpp sequence slots, driven by one background thread.

Each step decodes one batch that holds the next token of every generating sequence plus
chunks of newly admitted prompts, then samples each sequence with its own sampler chain.
Requests join and leave between steps; a finished, failed or cancelled request frees its slot
at once. A free slot keeps its tokens' KV so a later prompt with the same prefix reuses it.
"""

from __future__ import annotations

import codecs
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..config import ModelSpec
from ..errors import APIError, context_length_exceeded, internal_error, invalid_request
from . import hardware
from .llama import Batch, LlamaModelContext, NoValidToken, SamplerChain, check_grammar, decode
from .params import GenerationRequest
from .stop import StopMatcher

log = logging.getLogger("llamaray.engine")

MIN_COPY_TOKENS = 16

Sink = Callable[[tuple[Any, ...]], None]
"""Receives ("start", info) once, ("text", str, n_tokens) many times, then ("end", info) or
("error", APIError). Called on the engine thread: it must be quick and must not raise."""


class QueueSink:
    """Delivers events into an asyncio queue. The engine hands all of a step's events for one
    event loop over in a single call_soon_threadsafe (one wake-up per step, not per token)."""

    def __init__(self, loop: Any, queue: Any) -> None:
        self.loop = loop
        self.queue = queue

    def __call__(self, event: tuple[Any, ...]) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


def _deliver(items: list[tuple[Any, tuple[Any, ...]]]) -> None:
    for queue, event in items:
        queue.put_nowait(event)


@dataclass
class _Seq:
    req: GenerationRequest
    sink: Sink
    prompt: list[int]
    max_tokens: int
    sampler: SamplerChain | None = None
    slot: int = -1
    n_past: int = 0          # tokens of this request in the slot's KV
    cached: int = 0          # prompt tokens reused from the slot's previous occupant
    generated: int = 0
    pending_text_tokens: int = 0
    last_token: int = -1
    logits_at: int = -1      # index in the current batch whose logits this sequence samples
    decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    stop: StopMatcher | None = None


class LlamaEngine:
    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.mc = LlamaModelContext(
            spec.path, n_ctx_per_seq=spec.n_ctx, n_seq_max=spec.n_seq_max, n_batch=spec.n_batch,
            n_threads=spec.n_threads, n_threads_batch=spec.n_threads_batch, n_gpu_layers=spec.n_gpu_layers,
            kv_unified=spec.kv_unified,
            extra_buffers=hardware.use_extra_buffers(spec.cpu_extra_buffers, hardware.system_info()),
        )
        self.n_ctx = spec.n_ctx
        self._batch = Batch(max(spec.n_batch, spec.n_seq_max))
        self._cv = threading.Condition()
        self._waiting: deque[_Seq] = deque()
        self._cancelled: set[str] = set()
        self._slots: list[_Seq | None] = [None] * spec.n_seq_max
        self._slot_tokens: list[list[int]] = [[] for _ in range(spec.n_seq_max)]
        self._closing = False
        self._outbox: list[tuple[Sink, tuple[Any, ...]]] = []
        self.broken: str | None = None
        self.steps = 0
        self._thread = threading.Thread(target=self._run, name=f"llama-engine-{spec.id}", daemon=True)
        self._thread.start()

    # -- called from any thread ------------------------------------------------------------------
    def prepare(self, req: GenerationRequest, sink: Sink) -> _Seq:
        """Tokenize and check limits; raises APIError (400) before anything is queued."""
        prompt = self.mc.tokenize_prompt(req.prompt)
        if not prompt:
            prompt = [self.mc.bos]
        limit = req.max_tokens if req.max_tokens is not None else self.spec.default_max_tokens
        if len(prompt) >= self.n_ctx or (limit is not None and len(prompt) + limit > self.n_ctx):
            raise context_length_exceeded(self.n_ctx, len(prompt), limit)
        if req.sampling.grammar:
            check_grammar(self.mc, req.sampling.grammar)
        seq = _Seq(req=req, sink=sink, prompt=prompt, max_tokens=limit if limit is not None else self.n_ctx - len(prompt))
        seq.stop = StopMatcher(req.stop)
        return seq

    def submit(self, seq: _Seq) -> None:
        with self._cv:
            if self.broken:
                raise APIError(f"The model engine is unavailable: {self.broken}", status=503,
                               type="server_error", code="engine_unavailable")
            self._waiting.append(seq)
            self._cv.notify()

    def cancel(self, request_id: str) -> None:
        with self._cv:
            self._cancelled.add(request_id)
            self._cv.notify()

    def stats(self) -> dict[str, Any]:
        with self._cv:
            return {
                "running": sum(s is not None for s in self._slots),
                "waiting": len(self._waiting),
                "slots": len(self._slots),
                "steps": self.steps,
                "healthy": self.healthy(),
            }

    @property
    def active(self) -> int:
        """Sequences in slots (read without the lock: a hint, not an exact count)."""
        return sum(s is not None for s in self._slots)

    def healthy(self) -> bool:
        return self.broken is None and self._thread.is_alive()

    def close(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join(timeout=30)
        self._batch.free()
        self.mc.close()

    # -- the decode thread -----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._closing and not self._waiting and not any(self._slots) and not self._cancelled:
                        self._cv.wait()
                    if self._closing:
                        break
                    cancelled, self._cancelled = self._cancelled, set()
                    self._drop_cancelled(cancelled)
                    self._admit()
                self._flush()
                if any(self._slots):
                    self._step()
                    self._flush()
        except BaseException as exc:  # noqa: BLE001 - the thread must report, not vanish
            log.exception("engine thread died")
            self.broken = f"decode loop failed: {exc}"
        finally:
            self.broken = self.broken or "engine closed"
            self._fail_all(APIError("The model engine stopped.", status=503, type="server_error",
                                    code="engine_unavailable"))

    def _out(self, seq: _Seq, event: tuple[Any, ...]) -> None:
        self._outbox.append((seq.sink, event))

    def _flush(self) -> None:
        if not self._outbox:
            return
        out, self._outbox = self._outbox, []
        by_loop: dict[Any, list[tuple[Any, tuple[Any, ...]]]] = {}
        for sink, event in out:
            if isinstance(sink, QueueSink):
                by_loop.setdefault(sink.loop, []).append((sink.queue, event))
            else:
                sink(event)
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # that event loop is closed: nobody is listening
                pass

    def _drop_cancelled(self, ids: set[str]) -> None:
        if not ids:
            return
        self._waiting = deque(s for s in self._waiting if s.req.request_id not in ids)
        for seq in self._slots:
            if seq is not None and seq.req.request_id in ids:
                self._release(seq, keep_cache=False)

    def _admit(self) -> None:
        while self._waiting and None in self._slots:
            seq = self._waiting.popleft()
            try:
                seq.sampler = SamplerChain(self.mc, seq.req.sampling)
                if not seq.sampler.advance(seq.req.sampling.grammar_prefix):
                    # The prefix does not fit the grammar: continue unconstrained.
                    seq.sampler.free()
                    seq.sampler = SamplerChain(self.mc, replace(seq.req.sampling, grammar=None))
            except APIError as exc:
                self._out(seq, ("error", exc))
                continue
            except Exception:  # noqa: BLE001 - one bad request must not stop the loop
                log.exception("could not build the sampler for %s", seq.req.request_id)
                self._out(seq, ("error", internal_error("Could not set up sampling for this request.")))
                continue
            slot, source, reuse = self._pick_slot(seq.prompt)
            # Always recompute at least the last prompt token so there are logits to sample from.
            reuse = self._place_prefix(slot, source, min(reuse, len(seq.prompt) - 1))
            self._slot_tokens[slot] = seq.prompt[:reuse]
            seq.slot, seq.n_past, seq.cached = slot, reuse, reuse
            self._slots[slot] = seq
            self._out(seq, ("start", {"prompt_tokens": len(seq.prompt), "cached_tokens": reuse}))

    def _place_prefix(self, slot: int, source: int, reuse: int) -> int:
        """Make `slot`'s KV hold the first `reuse` prompt tokens (kept, or copied from `source`);
        the number actually kept. A KV edit llama.cpp refuses (recurrent or hybrid models cannot
        cut a sequence at a position) means the prefix is recomputed instead: 0."""
        if source == slot:
            if self.mc.seq_rm(slot, reuse, -1):  # keep the shared prefix, drop the rest
                return reuse
        else:
            # Another slot holds the longest prefix (a shared system prompt, a conversation that
            # moved): reuse its KV instead of recomputing it. In one unified pool the cells are
            # shared; across per-slot streams llama.cpp copies only whole streams (a partial copy
            # aborts), so copy it all and trim.
            self.mc.seq_rm(slot, 0, -1)
            if reuse > 0 and self.spec.kv_unified:
                self.mc.seq_cp(source, slot, 0, reuse)
                return reuse
            if reuse > 0:
                self.mc.seq_cp(source, slot, -1, -1)
                if self.mc.seq_rm(slot, reuse, -1):
                    return reuse
        self.mc.seq_rm(slot, 0, -1)  # a whole-sequence removal always succeeds
        return 0

    def _pick_slot(self, prompt: list[int]) -> tuple[int, int, int]:
        """(free slot to use, slot whose KV holds the longest prefix of `prompt`, its length).

        A free slot that already holds the best prefix is used as it is. Otherwise the prefix is
        copied from wherever it is (a busy slot's earlier positions never change), into the free
        slot whose own cache is worth least."""
        prefix = [_common_prefix(tokens, prompt) for tokens in self._slot_tokens]
        free = [i for i, occupant in enumerate(self._slots) if occupant is None]
        best_free = max(free, key=lambda i: prefix[i])
        source = max(range(len(prefix)), key=lambda i: (prefix[i], self._slots[i] is None))
        # Copying between per-slot streams moves a whole stream: only worth it for a real prefix.
        if prefix[source] - prefix[best_free] < MIN_COPY_TOKENS:
            return best_free, best_free, prefix[best_free]
        target = min(free, key=lambda i: len(self._slot_tokens[i]))
        return target, source, prefix[source]

    def _step(self) -> None:
        batch = self._batch
        batch.clear()
        active = [s for s in self._slots if s is not None]
        counts: dict[int, int] = {}  # tokens each slot puts in this batch
        for seq in active:
            seq.logits_at = -1
            if seq.n_past >= len(seq.prompt):  # generating: one token each
                seq.logits_at = batch.add(seq.last_token, seq.n_past, seq.slot, True)
                counts[seq.slot] = 1
        budget = batch.capacity - batch.n
        for seq in active:
            if seq.n_past >= len(seq.prompt) or budget <= 0:
                continue
            # Prompt in chunks, so a long prompt never stalls the running streams for long.
            take = min(len(seq.prompt) - seq.n_past, budget)
            for k in range(take):
                pos = seq.n_past + k
                last = pos == len(seq.prompt) - 1
                idx = batch.add(seq.prompt[pos], pos, seq.slot, last)
                if last:
                    seq.logits_at = idx
            counts[seq.slot] = take
            budget -= take
        if batch.n == 0:
            return
        rc = decode(self.mc, batch)
        self.steps += 1
        if rc != 0:
            log.warning("llama_decode returned %d for a batch of %d tokens; retrying each sequence alone", rc, batch.n)
            self._step_one_by_one(active, counts)
            return
        self._advance(active, counts)

    def _step_one_by_one(self, active: list[_Seq], counts: dict[int, int]) -> None:
        """After a failed batch: each sequence's part decoded (and sampled) alone, so the one that
        llama.cpp cannot decode fails and the others go on. A failed decode may leave some of the
        batch in the KV, so every sequence is first cut back to what it held before the step."""
        for seq in active:
            if seq.slot in counts:
                self.mc.seq_rm(seq.slot, seq.n_past, -1)
        for seq in active:
            n = counts.get(seq.slot, 0)
            if not n or self._slots[seq.slot] is not seq:
                continue
            self._batch.clear()
            tokens = [seq.last_token] if seq.n_past >= len(seq.prompt) else seq.prompt[seq.n_past:seq.n_past + n]
            for k, token in enumerate(tokens):
                idx = self._batch.add(token, seq.n_past + k, seq.slot, k == len(tokens) - 1)
            seq.logits_at = idx if seq.logits_at >= 0 else -1
            rc = decode(self.mc, self._batch)
            if rc != 0:
                log.error("llama_decode returned %d for request %s alone", rc, seq.req.request_id)
                self._fail(seq, internal_error(f"llama_decode failed ({rc}) for this request."))
                continue
            self._advance([seq], {seq.slot: n})

    def _advance(self, active: list[_Seq], counts: dict[int, int]) -> None:
        for seq in active:
            n = counts.get(seq.slot, 0)
            if not n:
                continue
            if seq.n_past < len(seq.prompt):
                self._slot_tokens[seq.slot].extend(seq.prompt[seq.n_past:seq.n_past + n])
            else:
                self._slot_tokens[seq.slot].append(seq.last_token)
            seq.n_past += n
            if seq.logits_at >= 0:
                try:
                    self._sample(seq)
                except NoValidToken as exc:
                    self._fail(seq, invalid_request(f"The request's grammar cannot be satisfied: {exc}.",
                                                    param="grammar", code="grammar_unsatisfiable"))
                except Exception:  # noqa: BLE001 - fail this request, keep serving the others
                    log.exception("sampling failed for %s", seq.req.request_id)
                    self._fail(seq, internal_error("Sampling failed for this request."))

    def _sample(self, seq: _Seq) -> None:
        token = seq.sampler.sample(seq.logits_at)
        seq.generated += 1
        if self.mc.is_eog(token):
            self._finish(seq, "stop")
            return
        seq.last_token = token
        seq.pending_text_tokens += 1
        text = seq.decoder.decode(self.mc.piece(token))
        out, matched = seq.stop.feed(text)
        if out:
            self._out(seq, ("text", out, seq.pending_text_tokens))
            seq.pending_text_tokens = 0
        if matched:
            self._finish(seq, "stop", flush=False)
        elif seq.generated >= seq.max_tokens or seq.n_past + 1 >= self.n_ctx:
            self._finish(seq, "length")

    def _finish(self, seq: _Seq, reason: str, flush: bool = True) -> None:
        if flush:
            tail = seq.stop.feed(seq.decoder.decode(b"", final=True))[0] + seq.stop.flush()
            if tail:
                self._out(seq, ("text", tail, seq.pending_text_tokens))
                seq.pending_text_tokens = 0
        # Free the slot before telling the client, so a follow-up request finds it free.
        self._release(seq, keep_cache=True)
        self._out(seq, ("end", {
            "finish_reason": reason,
            "prompt_tokens": len(seq.prompt),
            "completion_tokens": seq.generated,
            "cached_tokens": seq.cached,
        }))

    def _fail(self, seq: _Seq, err: APIError) -> None:
        self._release(seq, keep_cache=False)
        self._out(seq, ("error", err))

    def _release(self, seq: _Seq, keep_cache: bool) -> None:
        if seq.sampler is not None:
            seq.sampler.free()
            seq.sampler = None
        if seq.slot >= 0 and self._slots[seq.slot] is seq:
            self._slots[seq.slot] = None
            if not keep_cache:
                self.mc.seq_rm(seq.slot, 0, -1)
                self._slot_tokens[seq.slot] = []

    def _fail_all(self, err: APIError) -> None:
        with self._cv:
            for seq in list(self._waiting):
                self._out(seq, ("error", err))
            self._waiting.clear()
            for seq in self._slots:
                if seq is not None:
                    self._out(seq, ("error", err))
                    if seq.sampler is not None:
                        seq.sampler.free()
            self._slots = [None] * len(self._slots)
        self._flush()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
