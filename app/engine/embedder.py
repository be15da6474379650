"""The embedding engine: many inputs of many requests pooled into vectors by one llama_decode.

A reranker (rank pooling) runs on the same engine: a RerankJob's inputs are its (query, document) pairs,
formatted as llama-server formats them (rerank_format.py), and each pooled output is the pair's score.

`prepare` (any thread; off the event loop: `embed` runs it in one) tokenizes a job's inputs and checks them
against the model's context and the request's token budget, so bad input is an engine error before anything is
queued. One decode thread drains the queue: it packs the waiting inputs, first come first served, into one
batch of at most `n_seq_max` sequences and `n_batch` tokens (a sequence id per input), decodes it, and
hands each request its vectors once all of its inputs are done. A request's inputs may span several
batches, and share each with other requests' inputs.

Results go back through `concurrent.futures.Future`s; `embed` awaits one from asyncio. A request whose
caller gave up before its inputs were taken is dropped unseen.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import Future, InvalidStateError
from typing import Any

import numpy as np

from ..tenants.prep_pool import PREPARATION
from ..config.spec import ModelSpec, place
from . import hardware
from .decode_thread import DecodeThread
from .errors import EngineError, bad_input, internal
from .llama import Batch, LlamaModelContext, embed_batch
from .params import EmbeddingJob, EmbeddingResult, RerankJob, RerankResult
from .rerank_format import PairVocab, format_pair

log = logging.getLogger("llamaray.embedder")


class _Pending:
    """A prepared job in the queue: its inputs' tokens, the vectors so far and the future to complete."""

    __slots__ = ("job", "tokens", "vectors", "next", "left", "future")

    def __init__(self, job: EmbeddingJob | RerankJob, tokens: list[list[int]]) -> None:
        self.job = job
        self.tokens = tokens
        self.vectors: list[np.ndarray | None] = [None] * len(tokens)
        self.next = 0  # the first input not yet taken into a batch
        self.left = len(tokens)  # inputs not yet embedded
        self.future: Future = Future()


class EmbeddingEngine(DecodeThread):
    pair_vocab: PairVocab | None = None  # a reranker's (rank pooling): how its (query, document) pairs are formed

    def __init__(self, spec: ModelSpec) -> None:
        spec = place(spec)
        super().__init__(f"llama-embedder-{spec.id}")
        self.spec = spec
        self.llama = LlamaModelContext(
            spec.path, n_ctx_per_seq=spec.n_ctx, n_seq_max=spec.n_seq_max, n_batch=spec.n_batch,
            n_threads=spec.n_threads, n_threads_batch=spec.n_threads_batch, n_gpu_layers=spec.n_gpu_layers,
            kv_unified=spec.kv_unified, pooling=spec.pooling,
            extra_buffers=hardware.use_extra_buffers(spec.cpu_extra_buffers, hardware.system_info()),
        )
        self.n_ctx = spec.n_ctx
        self.pair_vocab = self.llama.pair_vocab() if spec.pooling == "rank" else None
        self._batch = Batch(spec.n_batch)
        self._waiting: deque[_Pending] = deque()
        self.running = 0  # inputs in the batch being decoded
        self.steps = 0
        self.tokens_decoded = 0

    # -- called from any thread ------------------------------------------------------------------
    def prepare(self, job: EmbeddingJob | RerankJob) -> list[list[int]]:
        """Each input's tokens, checked: ids in the vocabulary, within the context (or truncated as the job
        asks), the total within its budget. Bad input (an engine error) naming the input otherwise."""
        if isinstance(job, RerankJob):
            return self._prepare_pairs(job)
        limit = self._truncation_limit(job.truncate)
        out: list[list[int]] = []
        total = 0
        for i, item in enumerate(job.inputs):
            where = "input" if job.single else f"input[{i}]"
            tokens = self._tokens(item, where)
            if not tokens:
                raise bad_input(f"`{where}` makes no tokens.", where, "empty_input")
            if len(tokens) > limit:
                if job.truncate is None:
                    raise bad_input(
                        f"`{where}` is {len(tokens)} tokens; model `{self.spec.id}` embeds at most {self.n_ctx} "
                        f"tokens per input. Shorten it, or set `truncate_prompt_tokens` to keep its last tokens.",
                        where, "context_length_exceeded")
                tokens = tokens[-limit:]
            total += len(tokens)
            if job.max_total_tokens is not None and total > job.max_total_tokens:
                raise bad_input(f"The inputs make more than {job.max_total_tokens} tokens (at `{where}`); "
                                f"this server embeds at most that many in one request "
                                f"(limits.max_embedding_tokens). Send them in several requests.",
                                "input", "too_many_tokens")
            out.append(tokens)
        return out

    def _truncation_limit(self, truncate: int | None) -> int:
        """Tokens an input may keep: the context, or fewer where `truncate_prompt_tokens` asks (-1: the context)."""
        if truncate is None or truncate < 0:
            return self.n_ctx
        if truncate > self.n_ctx:
            raise bad_input(f"`truncate_prompt_tokens` is {truncate}; model `{self.spec.id}` reads at most "
                            f"{self.n_ctx} tokens per input.", "truncate_prompt_tokens", "invalid_value")
        return truncate

    def _prepare_pairs(self, job: RerankJob) -> list[list[int]]:
        """Each (query, document) pair's tokens, checked like an embedding input; a long pair loses its
        document's last tokens when the job says `truncate`."""
        if self.pair_vocab is None:
            raise bad_input(f"Model `{self.spec.id}` is not a reranker (rank pooling).", "model", "unsupported_model")

        def tokenize(text: str, parse_special: bool) -> list[int]:
            return self.llama.tokenize(text, add_special=False, parse_special=parse_special)

        limit = self._truncation_limit(job.truncate)
        out: list[list[int]] = []
        total = 0
        for i, document in enumerate(job.documents):
            where = f"documents[{i}]"
            pair = format_pair(self.pair_vocab, tokenize, job.query, document)
            if len(pair.tokens) > limit:
                cut = pair.truncated(limit) if job.truncate is not None else None
                if cut is None:
                    raise bad_input(
                        f"The query with `{where}` is {len(pair.tokens)} tokens; model `{self.spec.id}` reads at "
                        f"most {limit} tokens per pair. Shorten it"
                        + ("" if job.truncate is not None else
                           ", or set `truncate_prompt_tokens` to cut the end of long documents")
                        + ".", where, "context_length_exceeded")
                pair = cut
            total += len(pair.tokens)
            if job.max_total_tokens is not None and total > job.max_total_tokens:
                raise bad_input(f"The pairs make more than {job.max_total_tokens} tokens (at `{where}`); "
                                f"this server reranks at most that many in one request "
                                f"(limits.max_rerank_tokens). Send fewer documents.", "documents", "too_many_tokens")
            out.append(pair.tokens)
        return out

    def _tokens(self, item: str | tuple[int, ...], where: str) -> list[int]:
        if isinstance(item, str):
            # Client text never becomes a control token; the model's own ([CLS] ... [SEP]) are added.
            return self.llama.tokenize(item, add_special=True, parse_special=False)
        n_vocab = self.llama.n_vocab
        for j, token in enumerate(item):
            if not 0 <= token < n_vocab:  # llama.cpp aborts on an id outside the vocabulary
                raise bad_input(f"Token id {token} (`{where}[{j}]`) is not in the vocabulary of model "
                                f"`{self.spec.id}` (ids 0 to {n_vocab - 1}).", where, "invalid_token")
        return list(item)

    def submit(self, job: EmbeddingJob | RerankJob, tokens: list[list[int]]) -> Future:
        """Queue a prepared job; its future gets the EmbeddingResult or RerankResult (or an engine error). Any
        thread."""
        pending = _Pending(job, tokens)
        self._enqueue(pending)
        return pending.future

    def embed_now(self, job: EmbeddingJob | RerankJob, timeout_s: float | None = None) -> EmbeddingResult | RerankResult:
        """prepare + submit + wait, on the caller's thread (tests, tools)."""
        return self.submit(job, self.prepare(job)).result(timeout_s)

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.llama.tokenize(text, add_special=add_special, parse_special=False)

    def detokenize(self, tokens: list[int]) -> str:
        n_vocab = self.llama.n_vocab
        for i, token in enumerate(tokens):
            if not 0 <= token < n_vocab:
                raise bad_input(f"Token id {token} (tokens[{i}]) is not in the vocabulary of model "
                                f"`{self.spec.id}` (ids 0 to {n_vocab - 1}).", f"tokens[{i}]", "invalid_token")
        return self.llama.detokenize(tokens)

    def stats(self) -> dict[str, Any]:
        with self._cv:
            waiting = sum(p.left for p in self._waiting)
        return {"running": self.running, "waiting": waiting, "slots": self.spec.n_seq_max, "steps": self.steps,
                "tokens_decoded": self.tokens_decoded, "healthy": self.healthy(), "prompt_cache": {}}

    @property
    def active(self) -> int:
        return self.running

    def close(self) -> None:
        super().close()
        self._batch.free()
        self.llama.close()

    # -- the decode thread -----------------------------------------------------------------------
    def _take(self) -> list[tuple[_Pending, int]]:
        """The next batch's inputs, in queue order (under the lock): as many as fit in n_seq_max sequences and
        n_batch tokens. A job leaves the queue once all its inputs are taken."""
        taken: list[tuple[_Pending, int]] = []
        size = 0
        while self._waiting and len(taken) < self.spec.n_seq_max:
            pending = self._waiting[0]
            if pending.next == 0 and not pending.future.set_running_or_notify_cancel():
                self._waiting.popleft()  # its caller gave up before any work
                continue
            n = len(pending.tokens[pending.next])
            if size + n > self.spec.n_batch:
                break
            taken.append((pending, pending.next))
            size += n
            pending.next += 1
            if pending.next == len(pending.tokens):
                self._waiting.popleft()
        return taken

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not (self._closing or self._waiting):
                    self._cv.wait()
                if self._closing:
                    return
                taken = self._take()
            if taken:
                self._step(taken)

    def stopped_error(self) -> EngineError:
        return self.unavailable_error()  # the waiting jobs are told why, as later submissions are

    def _fail_all(self, error: EngineError) -> None:
        self.running = 0
        with self._cv:
            left, self._waiting = list(self._waiting), deque()
        for pending in left:
            _fail(pending, error)

    def _step(self, taken: list[tuple[_Pending, int]]) -> None:
        self.running = len(taken)
        batch = self._batch
        batch.clear()
        for seq, (pending, index) in enumerate(taken):
            for pos, token in enumerate(pending.tokens[index]):
                batch.add(token, pos, seq, True)  # pooling needs every token as an output
        started = time.perf_counter()
        vectors = embed_batch(self.llama, batch, len(taken))
        self.steps += 1
        self.tokens_decoded += batch.n
        self.running = 0
        if vectors is None:
            log.error("llama_decode refused a batch of %d inputs (%d tokens)", len(taken), batch.n)
            error = internal("The model could not embed these inputs.", code="decode_failed", logged=False)
            for pending in {id(p): p for p, _ in taken}.values():
                _fail(pending, error)
                with self._cv:
                    if pending in self._waiting:
                        self._waiting.remove(pending)
            return
        log.debug("embedded %d inputs (%d tokens) in %.1f ms", len(taken), batch.n,
                  (time.perf_counter() - started) * 1000)
        for row, (pending, index) in enumerate(taken):
            job = pending.job
            if isinstance(job, RerankJob):
                # A classifier with several outputs (n_cls_out > 1) scores relevance in its first, as
                # llama-server reads it.
                pending.vectors[index] = float(vectors[row][0])
            else:
                pending.vectors[index] = finish_vector(vectors[row], job.dimensions, self.spec.normalize)
            pending.left -= 1
            if pending.left == 0 and not pending.future.done():
                prompt_tokens = sum(len(t) for t in pending.tokens)
                result = (RerankResult(tuple(pending.vectors), prompt_tokens) if isinstance(job, RerankJob)
                          else EmbeddingResult(tuple(pending.vectors), prompt_tokens))
                pending.future.set_result(result)


def _fail(pending: _Pending, error: EngineError) -> None:
    try:
        pending.future.set_exception(error)
    except InvalidStateError:  # done already, or cancelled by its caller meanwhile
        pass


def finish_vector(vector: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """A pooled vector as the client gets it: its first `dimensions` components (a Matryoshka model keeps
    their meaning), then scaled to unit length when the model's entry says `normalize`."""
    out = vector[:dimensions] if dimensions else vector
    if normalize:
        norm = float(np.linalg.norm(out))
        out = out / norm if norm > 0 else out
    return np.ascontiguousarray(out, dtype=np.float32)


async def embed(engine: EmbeddingEngine, job: EmbeddingJob | RerankJob) -> EmbeddingResult | RerankResult:
    """The job's vectors (or a rerank job's scores), from asyncio: prepared in a thread (tokenizing is CPU work), then awaited. Cancelling
    the caller drops the job if the engine has not started on it."""
    tokens = await PREPARATION.run("", engine.prepare, job)
    return await asyncio.wrap_future(engine.submit(job, tokens))
