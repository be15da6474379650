"""Draft-model speculation: a smaller model that shares the target's vocabulary, loaded on the same replica with
a context of its own (a sequence per target slot), proposes each sequence's next tokens greedily.

The draft's KV of a slot holds a prefix of what that slot's sequence has been; before proposing, it is cut back to
where it last agreed with the sequence (rejected drafts, or another request's tokens in a reused slot) and the
tokens since are decoded, every drafting sequence's in one batch; then the k proposals are decoded one position
at a time, all sequences together. The target verifies the proposals as it does prompt lookup's (engine.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from .llama import Batch, LlamaModelContext, argmax_at, decode
from .speculation import StepCost

log = logging.getLogger("llamaray.engine")


class DraftVocabMismatch(ValueError):
    """The draft model's vocabulary is not the target's: its token ids would mean other tokens."""


@dataclass
class DraftAsk:
    """One sequence's request for proposals: its KV sequence (the target slot), the tokens it holds, the
    token sampled last (not yet decoded), and how many to propose."""

    seq: int
    tokens: Sequence[int]
    last: int
    k: int


class DraftModel:
    """The draft model of one engine; used from the engine's decode thread only."""

    cheap = False  # proposing costs decodes: the engine asks only where drafts may pay (speculation.py)

    def __init__(self, path: str, *, target_vocab: int, n_ctx_per_seq: int, n_seq_max: int, n_batch: int,
                 n_threads: int, n_threads_batch: int, n_gpu_layers: int, kv_unified: bool,
                 extra_buffers: bool) -> None:
        self.llama = LlamaModelContext(path, n_ctx_per_seq=n_ctx_per_seq, n_seq_max=n_seq_max, n_batch=n_batch,
                                       n_threads=n_threads, n_threads_batch=n_threads_batch,
                                       n_gpu_layers=n_gpu_layers, kv_unified=kv_unified, extra_buffers=extra_buffers)
        if self.llama.n_vocab != target_vocab:
            n_vocab = self.llama.n_vocab
            self.llama.close()
            raise DraftVocabMismatch(f"the draft model has {n_vocab} tokens in its vocabulary, the model "
                                     f"{target_vocab}: a draft must share the model's vocabulary")
        if not self.llama.can_cut_back:
            self.llama.close()
            raise DraftVocabMismatch("the draft model is recurrent or hybrid: its state cannot be cut back "
                                     "past rejected drafts")
        self._held: list[list[int]] = [[] for _ in range(n_seq_max)]  # what each sequence's draft KV holds
        self._batch = Batch(max(n_batch, n_seq_max))
        self.step_cost = StepCost({1: 0.0})
        self.failures = 0

    def measure(self) -> None:
        """A draft token's decode time (one sequence, one row): what each proposed token costs."""
        token = self.llama.tokenize_prompt(" the", False)[-1]

        def decode_rows(n: int) -> None:
            self._batch.clear()
            for pos in range(n):
                self._batch.add(token, pos, 0, pos == n - 1)
            try:
                decode(self.llama, self._batch)
            finally:
                self.llama.seq_rm(0, 0, -1)
                self._held[0] = []

        self.step_cost = StepCost.measure(decode_rows, [1, 2])

    def seconds_per_token(self) -> float:
        return self.step_cost.seconds(1)

    def sequence(self) -> None:
        return None  # a sequence's draft state is its slot's draft KV, kept here

    def propose_all(self, asks: list[DraftAsk]) -> list[list[int]]:
        """Each ask's proposals (up to its k), in order; [] for all when the draft cannot decode."""
        try:
            return self._propose(asks)
        except Exception:  # noqa: BLE001 - speculation is an optimisation: the sequences go on without drafts
            self.failures += 1
            log.exception("the draft model failed to propose; its sequences are decoded again from scratch")
            for ask in asks:
                self.llama.seq_rm(ask.seq, 0, -1)
                self._held[ask.seq] = []
            return [[] for _ in asks]

    def _propose(self, asks: list[DraftAsk]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in asks]
        live = [i for i, ask in enumerate(asks) if ask.k > 0]
        tails: dict[int, list[int]] = {}
        for i in live:  # cut each draft sequence back to where it agrees with its target sequence
            ask = asks[i]
            held, full = self._held[ask.seq], [*ask.tokens, ask.last]
            agree = 0
            for a, b in zip(held, full):
                if a != b:
                    break
                agree += 1
            agree = min(agree, len(full) - 1)  # the last token is decoded again: its logits give the proposal
            self.llama.seq_rm(ask.seq, agree, -1)
            self._held[ask.seq] = full
            tails[i] = full[agree:]
        # Everything before each sequence's last token, in batches, no logits; then every last token together.
        rows = [(asks[i].seq, len(asks[i].tokens) + 1 - len(tails[i]) + j, t) for i in live for j, t in
                enumerate(tails[i][:-1])]
        for start in range(0, len(rows), self._batch.capacity):
            self._decode([(seq, pos, t, False) for seq, pos, t in rows[start:start + self._batch.capacity]])
        step = [(i, len(asks[i].tokens), asks[i].last) for i in live]
        while step:
            at = self._decode([(asks[i].seq, pos, t, True) for i, pos, t in step])
            nxt = []
            for (i, pos, _), row in zip(step, at):
                token = argmax_at(self.llama, row)
                out[i].append(token)
                if len(out[i]) < asks[i].k:
                    self._held[asks[i].seq].append(token)
                    nxt.append((i, pos + 1, token))
            step = nxt
        return out

    def _decode(self, rows: list[tuple[int, int, int, bool]]) -> list[int]:
        """(seq, pos, token, logits) rows as one batch; the batch index of each row."""
        batch = self._batch
        batch.clear()
        at = [batch.add(token, pos, seq, logits) for seq, pos, token, logits in rows]
        rc = decode(self.llama, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} on the draft model")
        return at

    def close(self) -> None:
        self._batch.free()
        self.llama.close()
