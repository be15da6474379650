"""Constrained decoding with llguidance: one matcher per sequence, its token mask computed beside the decode.

A sequence's mask for its next token depends only on the tokens it has taken, all known before the step's
decode starts; `MaskWorker` computes the stale masks of the step's constrained sequences on a thread of its
own while llama_decode runs (llguidance and llama.cpp both release the GIL), so the sampler applies a mask
that is already there. Unconstrained sequences never touch this module.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import llama_cpp as L
import numpy as np
from llguidance import LLMatcher, LLParserLimits, LLTokenizer
from llguidance.llamacpp import lltokenizer_from_vocab

log = logging.getLogger("llamaray.constraint")


class LLGuidancePanic(RuntimeError):
    """llguidance's Rust code panicked on a grammar (pyo3 raises a PanicException, a BaseException that
    `except Exception` misses: left alone, it would end the engine's thread or the caller's task)."""


def guarded(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` with an llguidance panic turned into LLGuidancePanic."""
    try:
        return fn(*args, **kwargs)
    except BaseException as exc:
        if type(exc).__name__ == "PanicException":
            raise LLGuidancePanic(str(exc)[:300]) from None
        raise


def parser_limits() -> LLParserLimits:
    """llguidance's bounds on a grammar's compile (lexer fuel ~50k/ms: ~20 ms) and on each token's mask
    (~15 ms of lexer and Earley work at most, usually microseconds: every stream of the replica waits for
    it); verbose errors off, so a refusal quotes the grammar's line, not the parser's state."""
    return LLParserLimits(initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000, step_max_items=50_000,
                          max_grammar_size=500_000, verbose_errors=False)


def grammar_tokenizer(vocab: Any) -> LLTokenizer:
    """llguidance's view of a model's vocabulary (~0.3 s for 49k tokens: built once per model). Every
    end-of-generation token ends a finished grammar, as llama.cpp's own grammar sampler allows."""
    n_vocab = int(L.llama_vocab_n_tokens(vocab))
    eog = [t for t in range(n_vocab) if L.llama_vocab_is_eog(vocab, t)] or [int(L.llama_vocab_eos(vocab))]
    return lltokenizer_from_vocab(vocab, eos_token=eog)


_PENALTY = np.array([-np.inf, 0.0], dtype=np.float32)  # what a token's mask bit (0, 1) adds to its logit


class GrammarRefused(ValueError):
    """llguidance refused the grammar against this vocabulary; `unsatisfiable`: it compiled, but no token
    can start a reply."""

    def __init__(self, message: str, unsatisfiable: bool = False) -> None:
        super().__init__(_readable(message))
        self.unsatisfiable = unsatisfiable


def _readable(message: str) -> str:
    """llguidance's message without the marker its non-verbose errors end with."""
    return message.replace("<non-verbose/>", "").strip()


class Constraint:
    """One sequence's grammar: its matcher, and the mask of the tokens allowed next (`fresh` while it
    describes the matcher's present state)."""

    def __init__(self, tokenizer: LLTokenizer, grammar: str, n_vocab: int) -> None:
        try:
            self.matcher = guarded(LLMatcher, tokenizer, grammar, log_level=0, limits=parser_limits())
        except LLGuidancePanic as exc:
            raise GrammarRefused(f"llguidance failed on it ({exc})") from None
        if self.matcher.is_error():
            raise GrammarRefused(self.matcher.get_error())
        self.n_vocab = n_vocab
        self.mask = np.zeros((n_vocab + 31) // 32, dtype=np.int32)
        self.penalty = np.zeros(n_vocab, dtype=np.float32)  # the mask unpacked: -inf where a token is ruled out
        self.none_allowed = True
        self.pending: int | None = None  # the token taken, consumed by the next fill (beside the decode)
        # The first mask now, on the preparing thread: it builds the lexer's first states (the costly
        # part of a large grammar), and a grammar llguidance gives up on is refused before it is queued.
        try:
            self.fill()
        except LLGuidancePanic as exc:
            raise GrammarRefused(f"llguidance failed on it ({exc})", unsatisfiable=True) from None
        if self.matcher.is_error():
            raise GrammarRefused(self.matcher.get_error(), unsatisfiable=True)

    def advance(self, tokens: Sequence[int]) -> bool:
        """Take `tokens` (a continued reply) if the grammar allows all of them; False (nothing taken) if not."""
        tokens = list(tokens)
        if not tokens:
            return True
        self._consume_pending()
        if guarded(self.matcher.validate_tokens, tokens) < len(tokens):
            return False
        self.fresh = False
        return guarded(self.matcher.consume_tokens, tokens)

    def accepts(self, tokens: Sequence[int]) -> bool:
        """Whether the grammar allows all of `tokens` next (its state unchanged)."""
        tokens = list(tokens)
        if not tokens:
            return True
        self._consume_pending()
        return guarded(self.matcher.validate_tokens, tokens) == len(tokens)

    def fill(self) -> None:
        """The mask for the matcher's present state, the token taken last consumed first (a token the
        matcher refuses leaves it in error: its next `restrict` says no token is allowed)."""
        self._consume_pending()
        guarded(self.matcher.unsafe_compute_mask_ptr, self.mask.ctypes.data, self.mask.nbytes)
        # Unpacked here, so the worker thread does it beside the decode, not the sampler after it: 0 where a
        # token is allowed, -inf where not, added to the logits (branch-free: a select over a mixed mask
        # costs several times more).
        allowed = np.unpackbits(self.mask.view(np.uint8), count=self.n_vocab, bitorder="little")
        np.take(_PENALTY, allowed, out=self.penalty)
        self.none_allowed = not allowed.any()
        self.fresh = True

    def allows(self, token: int) -> bool:
        """Whether the grammar allows `token` next (its state unchanged): from the mask when it is fresh,
        else by the matcher, token by token (microseconds)."""
        if self.fresh:
            return not self.none_allowed and self.penalty[token] == 0.0
        self._consume_pending()
        return guarded(self.matcher.validate_tokens, [token]) == 1

    def restrict(self, logits: np.ndarray) -> bool:
        """Rule out of `logits` (n_vocab floats, in place) every token the grammar does not allow next;
        False when it allows none."""
        if not self.fresh:
            self.fill()
        if self.matcher.is_error():  # its mask then holds only the ends of generation: not a reply
            return False
        if self.none_allowed:
            return False
        np.add(logits, self.penalty, out=logits)
        return True

    def _consume_pending(self) -> None:
        if self.pending is not None:
            token, self.pending = self.pending, None
            guarded(self.matcher.consume_token, token)

    def take(self, token: int) -> None:
        """`token` was sampled (from this mask, so the grammar allows it): the matcher consumes it with the
        next fill, on the mask worker's thread when the step has one. Tokens taken in a row without a fill between
        (a forced reasoning close) are consumed in their order."""
        self._consume_pending()
        self.pending = token
        self.fresh = False

    def error(self) -> str:
        return _readable(self.matcher.get_error())


class MaskWorker:
    """Computes stale masks on its own thread, beside the step's decode."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None

    def start(self, constraints: Sequence[Constraint]) -> Future[None] | None:
        stale = [c for c in constraints if not c.fresh]
        if not stale:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="llamaray-masks")
        return self._pool.submit(_fill_all, stale)

    @staticmethod
    def wait(pending: Future[None] | None) -> None:
        """Until the masks are there; a failure is left to the sampler (it fills a stale mask itself)."""
        if pending is not None:
            try:
                pending.result()
            except Exception:  # noqa: BLE001
                log.exception("computing token masks failed; the samplers compute theirs")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _fill_all(constraints: list[Constraint]) -> None:
    for c in constraints:
        c.fill()
