"""A synthetic engine for capacity planning: no GGUF, no GPU, tokens at configured rates.

It stands where the llama.cpp engine stands (same calls from the replica and from `stream.py`, same
events), so the real graph (Ingress, ChatProcessor, Ray hops, SSE) carries traffic at a GPU's speed on
any machine, and what the CPU tiers cost per delivered token can be measured without the GPU. vLLM has
dummy weights for the same purpose; Ray Serve LLM's tests use a mock engine.

The clock, per step: the prompt tokens admitted this step at `prefill_tokens_per_s`, plus one decode
step whose duration depends on the number of sequences decoding (interpolated between measured points,
extrapolated from the last two), slept, not computed: like a GPU, it leaves the CPU to the rest. Each
sequence then gets one token of text. Prompts are tokenized byte by byte (ids are bytes + 3, so any
text round-trips); replies are words from a fixed list, picked by the request's seed.

Not modelled: grammars, logprobs, prompt scoring and fill-in-the-middle (refused as bad input), KV reuse
(`cached_tokens` is 0), reasoning (its replies count no reasoning tokens and no budget applies).
"""

from __future__ import annotations

import bisect
import random
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from ..config.spec import ModelSpec
from .admission import in_share_order
from .decode_thread import DecodeThread
from .errors import ContextExceeded, EngineError, bad_input
from .events import Event, Failed, Finished, Started, Text
from .params import GenerationRequest, ImageInput
from .slots import Sink
from .stop import StopMatcher

SPECIAL = 3  # ids 0-2: BOS, EOS, padding; a byte b is token b + SPECIAL
WORDS = ("the ", "model ", "serves ", "many ", "streams ", "at ", "once ", "and ", "each ", "token ", "crosses ",
         "the ", "graph ", "to ", "reach ", "its ", "client ", "quickly. ")


@dataclass(frozen=True)
class SyntheticRates:
    """How fast the pretended accelerator is: prefill tokens per second, and the duration of one decode
    step (ms) measured at a few batch sizes (sequences decoding together). The preset (app/config/schema.py
    SYNTHETIC_PRESETS, `h200-smollm2-135m`) is the SmolLM2-135M Q4_1 engine on one H200 in `make gpu-check`:
    735, 2583 and 3368 tok/s with 1, 16 and 64 sequences, i.e. steps of 1.36, 6.19 and 19.0 ms. Prefill was
    not measured there: its 50,000 tok/s is an assumption (prompts of a few dozen tokens make it matter little)."""

    prefill_tokens_per_s: float
    step_ms: tuple[tuple[int, float], ...]

    def step_s(self, batch: int) -> float:
        """One decode step of `batch` sequences: linear between the measured points, and past the last
        one along the last segment's slope (the marginal cost of one more sequence)."""
        sizes = [b for b, _ in self.step_ms]
        times = [t for _, t in self.step_ms]
        if batch <= sizes[0] or len(sizes) == 1:
            return times[0] / 1000
        i = min(bisect.bisect_left(sizes, batch), len(sizes) - 1)
        (b0, t0), (b1, t1) = self.step_ms[i - 1], self.step_ms[i]
        return (t0 + (t1 - t0) * (batch - b0) / (b1 - b0)) / 1000


@dataclass(eq=False)
class _Generation:
    req: GenerationRequest
    sink: Sink
    prompt_tokens: int
    max_tokens: int
    index: int
    stop: StopMatcher
    rng: random.Random
    generated: int = 0
    started: bool = False
    prefill_left: int = 0
    choices: list["_Generation"] = field(default_factory=list)


class SyntheticEngine(DecodeThread):
    """A GenerationEngine (protocol.py) over a clock instead of a model."""

    JOIN_S = 5.0

    def __init__(self, spec: ModelSpec, rates: SyntheticRates, publish: Any) -> None:
        super().__init__(f"synthetic-engine-{spec.id}")
        self.spec = spec
        self.rates = rates
        self.n_ctx = spec.n_ctx
        self._publish = publish
        self._waiting: deque[_Generation] = deque()
        self._running: list[_Generation] = []
        self._cancelled: set[str] = set()
        self.steps = 0
        self.tokens_decoded = 0
        self.step_s = 0.0

    # -- the engine's interface ------------------------------------------------------------------
    def prepare(self, req: GenerationRequest, sink: Sink) -> _Generation:
        unsupported = ("grammar" if req.sampling.grammar else "logprobs" if req.logprobs is not None
                       else "echo with logprobs" if req.prompt_logprobs else None)
        if req.infill is not None:
            self.infill_tokens(req.infill, req.max_tokens)
        if unsupported:
            raise bad_input(f"Model `{self.spec.id}` is synthetic (capacity planning): it does not "
                            f"support {unsupported}.", unsupported.split()[0], "unsupported_by_model")
        if req.n > self.spec.n_seq_max:
            raise bad_input(f"`n` is {req.n}; model `{self.spec.id}` generates at most {self.spec.n_seq_max} "
                            f"choices at once (its n_seq_max).", "n", "n_too_large")
        prompt = len(self.tokenize(req.prompt))
        limit = req.max_tokens  # the request's, its default applied while planning (None: the context left)
        if prompt >= self.n_ctx or (limit is not None and prompt + limit > self.n_ctx):
            raise ContextExceeded(self.n_ctx, prompt, limit)
        seed = req.sampling.seed if req.sampling.seed is not None else random.getrandbits(31)

        def choice(index: int) -> _Generation:
            return _Generation(req, sink, prompt, limit if limit is not None else self.n_ctx - prompt, index,
                               StopMatcher(req.stop), random.Random(seed + index), prefill_left=prompt)

        first = choice(0)
        first.choices = [choice(i) for i in range(1, req.n)]
        return first

    def discard(self, gen: _Generation) -> None:
        pass  # holds nothing to free

    def submit(self, gen: _Generation) -> None:
        self._enqueue(gen)

    def cancel(self, request_id: str) -> None:
        with self._cv:
            self._cancelled.add(request_id)
            self._cv.notify()

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return ([0] if add_special else []) + [b + SPECIAL for b in text.encode("utf-8")]

    def detokenize(self, tokens: list[int]) -> str:
        for i, token in enumerate(tokens):
            if not 0 <= token < 256 + SPECIAL:
                raise bad_input(f"Token id {token} (tokens[{i}]) is not in the vocabulary of model "
                                f"`{self.spec.id}` (ids 0 to {256 + SPECIAL - 1}).", f"tokens[{i}]", "invalid_token")
        return bytes(t - SPECIAL for t in tokens if t >= SPECIAL).decode("utf-8", errors="replace")

    def infill_tokens(self, infill: Any, limit: int | None) -> list[int]:
        raise bad_input(f"Model `{self.spec.id}` cannot fill in the middle: it is synthetic (no vocabulary, no FIM "
                        f"tokens).", "model", "fim_unsupported")

    def count_prompt(self, prompt: str, images: list[ImageInput]) -> int:
        if images:
            raise bad_input(f"Model `{self.spec.id}` takes no images (it is synthetic).", "images", "images_unsupported")
        return len(self.tokenize(prompt))

    def load_adapter(self, name: str, path: str) -> Any:
        raise ValueError(f"model `{self.spec.id}` is synthetic: it takes no adapters")

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def active(self) -> int:
        return len(self._running)

    def stats(self) -> dict[str, Any]:
        with self._cv:
            return {"running": self.active, "waiting": len(self._waiting), "slots": self.spec.n_seq_max,
                    "steps": self.steps, "tokens_decoded": self.tokens_decoded, "healthy": self.healthy(),
                    "synthetic": True}

    # -- the clock ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        # When the last step's tokens came out; None after an idle wait. A step's measured duration
        # includes the host's share of it (on the GPU it was measured on too), so the work between two
        # steps here (making and publishing the events, admitting) is slept less, not on top: the clock
        # keeps the measured rate unless that work alone takes longer than a step.
        last_out: float | None = None
        while True:
            with self._cv:
                if not (self._closing or self._waiting or self._running):
                    last_out = None
                while not (self._closing or self._waiting or self._running):
                    self._cv.wait()
                if self._closing:
                    return
                cancelled, self._cancelled = self._cancelled, set()
                admitted = self._admit()
            self._running = [g for g in self._running if g.req.request_id not in cancelled]
            started = last_out if last_out is not None else time.perf_counter()
            decoding = [g for g in self._running if not g.prefill_left]
            prefill = sum(g.prefill_left for g in admitted)
            duration = prefill / self.rates.prefill_tokens_per_s + (self.rates.step_s(len(decoding))
                                                                     if decoding else 0.0)
            time.sleep(max(0.0, started + duration - time.perf_counter()))
            last_out = time.perf_counter()
            self._publish(self._step(admitted, decoding))
            self.steps += 1
            elapsed = last_out - started
            self.step_s = elapsed if self.step_s == 0.0 else 0.8 * self.step_s + 0.2 * elapsed

    def _fail_all(self, error: EngineError) -> None:
        with self._cv:
            held, self._waiting, self._running = [*self._waiting, *self._running], deque(), []
        self._publish([(g.sink, Failed(error)) for g in held])

    def _admit(self) -> list[_Generation]:
        """In order (the fair share's between keys, as the llama.cpp engine's), while the next one fits."""
        order = (in_share_order(self._waiting, Counter(g.req.tenant for g in self._running)) if self.spec.fair_share
                 else self._waiting)
        admitted, taken = [], set()
        for gen in order:
            if len(self._running) + 1 + len(gen.choices) > self.spec.n_seq_max:
                break
            taken.add(id(gen))
            if gen.req.request_id in self._cancelled:
                continue
            group = [gen, *gen.choices]
            self._running.extend(group)
            admitted.extend(group)
        if taken:
            self._waiting = deque(g for g in self._waiting if id(g) not in taken)
        return admitted

    def _step(self, admitted: list[_Generation], decoding: list[_Generation]) -> list[tuple[Sink, Event]]:
        out: list[tuple[Sink, Event]] = []
        for gen in admitted:
            gen.prefill_left = 0
            out.append((gen.sink, Started(prompt_tokens=gen.prompt_tokens, cached_tokens=0, index=gen.index)))
            if gen.max_tokens == 0:
                self._finish(gen, "length", out)
        for gen in decoding:
            gen.generated += 1
            self.tokens_decoded += 1
            text, matched = gen.stop.feed(gen.rng.choice(WORDS))
            if text:
                out.append((gen.sink, Text(text, 1, (), gen.index)))
            if matched:
                self._finish(gen, "stop", out)
            elif gen.generated >= gen.max_tokens or gen.prompt_tokens + gen.generated >= self.n_ctx:
                tail = gen.stop.flush()
                if tail:
                    out.append((gen.sink, Text(tail, 0, (), gen.index)))
                self._finish(gen, "length", out)
        return out

    def _finish(self, gen: _Generation, reason: str, out: list[tuple[Sink, Event]]) -> None:
        self._running.remove(gen)
        out.append((gen.sink, Finished(finish_reason=reason, prompt_tokens=gen.prompt_tokens,
                                       completion_tokens=gen.generated, cached_tokens=0, index=gen.index)))

