"""What one generation asks for: plain dataclasses that cross the Ray hop to the model as they are."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

R = TypeVar("R")


@dataclass
class SamplingParams:
    # llama.cpp's defaults (llama-server uses the same), not OpenAI's: temperature 1.0 with no
    # top-k/min-p makes small local models ramble.
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    penalty_last_n: int = 64
    seed: int | None = None
    # (token id, bias) pairs added to the logits before any other sampler (OpenAI's logit_bias).
    logit_bias: list[tuple[int, float]] = field(default_factory=list)
    grammar: str | None = None
    # llama.cpp's infill sampler before the final pick (llama-server's `samplers: [..., "infill"]`): where the
    # likeliest tokens share a prefix their chances are merged, and an end of generation is preferred when the
    # model is unsure of any text.
    infill: bool = False

    def resolved_seed(self) -> int:
        """llama.cpp takes a 32-bit seed; 0xFFFFFFFF means "random", so never pass it."""
        if self.seed is None:
            return random.getrandbits(31)
        return (self.seed & 0xFFFFFFFF) % 0xFFFFFFFF


# Where an image goes in a rendered prompt: llama.cpp's mtmd splits the prompt at this text. Only the
# prompt renderer writes it, outside client text (app/prompt/content_marks.py), so a client typing it
# adds no image.
IMAGE_MARKER = "<__media__>"


@dataclass(frozen=True)
class ImageInput:
    """One decoded image as the model's projector takes it: 8-bit RGB, rows top to bottom."""

    width: int
    height: int
    rgb: bytes  # width * height * 3 bytes
    digest: str  # sha256 of the encoded image, hex: names it in logs and keys its cached encoding


@dataclass(frozen=True)
class ReasoningLimit:
    """How a generation's reasoning is bounded (app/engine/reasoning_budget.py): the markers that open and close
    it (the model's reasoning parser's), whether the prompt already opened it (the template's generation prompt
    ends inside `<think>`), the most tokens the model may reason for (None: unbounded, only counted) and the
    message the engine writes before the closing marker when that budget is spent."""

    start: str = "<think>"
    end: str = "</think>"
    budget: int | None = None
    starts_open: bool = False
    message: str = ""


@dataclass(frozen=True)
class InfillPrompt:
    """A fill-in-the-middle prompt, laid out by the engine with the vocabulary's FIM tokens as llama-server's
    /infill lays it out (app/engine/infill.py): the text before the cursor, after it, other files of the project
    for context ((filename, text) pairs), and text the completion starts with. Client text stays text: only the
    layout writes FIM tokens; `prompt` alone is read for control tokens, as llama-server reads it."""

    prefix: str
    suffix: str
    extra: tuple[tuple[str, str], ...] = ()
    prompt: str = ""


@dataclass
class GenerationRequest:
    request_id: str
    prompt: str
    max_tokens: int | None = None  # 0: score the prompt only; None: up to the context (defaults are applied while planning)
    stop: list[str] = field(default_factory=list)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n: int = 1                     # choices, all from one decode of the prompt
    logprobs: int | None = None    # None: none; k: each token's logprob and its k most likely alternatives
    prompt_logprobs: bool = False  # score the prompt's tokens too (legacy completions' echo)
    # Whose KV this prompt may reuse and leave behind: prompts of one scope share cached prefixes, prompts of
    # different scopes never do (an API key's identity and the request's `cache_salt`; "" when neither).
    cache_scope: str = ""
    # False: the prompt is decoded whole, reusing no cached prefix. A reused prefix leaves the prompt's last
    # token to be decoded in a batch of another shape, whose floating-point sums differ in the last bits:
    # two identical seeded requests then agree only when neither reuses (llama-server's `cache_prompt`).
    cache_prompt: bool = True
    # Token ids generated earlier after this very prompt (a continued reply): they follow the tokenized
    # prompt as they are, so its KV prefix is reused exactly and no generated text ever turns into a
    # control token; the samplers (the grammar) start after them.
    continue_tokens: list[int] = field(default_factory=list)
    # The generation ends with a `Finished` that carries its generated token ids (a reply that may be continued
    # from them, /infill's `tokens`); off, every `Finished` stays small.
    return_tokens: bool = False
    # Most logprob entries this generation may make: prompt positions scored x (1 + logprobs) plus
    # generated tokens x n x (1 + logprobs), counted before it is queued. None: no bound. Planning gives
    # each generation its share of Limits.max_logprob_entries.
    max_logprob_entries: int | None = None
    # W3C trace context of the span this generation runs under (app/observe/tracing.py); None when not traced.
    traceparent: str | None = None
    # The prompt's images, in the order of their IMAGE_MARKERs in `prompt` (a model with a projector).
    images: list[ImageInput] = field(default_factory=list)
    # LoRA adapters to decode under, as (name, scale) pairs of adapters loaded on the model's engine
    # (LlamaEngine.load_adapter); () is the base model. A zero scale is the same as leaving the adapter out.
    adapters: tuple[tuple[str, float], ...] = ()
    # Whose request this is, for the engine's fair share of slots (app/tenants/fair_share.py): the tenant's
    # name ("" for a server without keys) and its priority's weight.
    tenant: str = ""
    weight: float = 1.0
    # A line of a batch job (app/batches/): it takes only the slots interactive requests leave, and gives its slot
    # up to one that waits (app/engine/admission.py, BatchShare).
    batch: bool = False
    # Speculative decoding where the model has it on (ModelConfig.speculative): False turns it off for this
    # request; spec_n_max / spec_n_min replace the model's n_max / n_min (llama-server's speculative.n_max/n_min).
    speculative: bool = True
    spec_n_max: int | None = None
    spec_n_min: int | None = None
    # Where the reply's reasoning is tracked, counted (Finished.reasoning_tokens) and bounded: a model whose replies
    # are read for reasoning. None: the reply is all answer.
    reasoning: ReasoningLimit | None = None
    # A fill-in-the-middle prompt, laid out from the vocabulary's FIM tokens in place of `prompt` (which is then "").
    infill: InfillPrompt | None = None

    @property
    def routed_text(self) -> str:
        """The text a router matches this prompt's prefixes by: the rendered prompt, or a fill-in-the-middle
        prompt's parts in the order its layout puts them (the other files first: an editor sends the same ones
        again as the text around its cursor changes, app/engine/infill.py)."""
        infill = self.infill
        if infill is None:
            return self.prompt
        return "".join(f"{name}\n{text}" for name, text in infill.extra) + "\x1e" + infill.prefix + infill.prompt

    @property
    def prefix_scope(self) -> str:
        """The scope a router matches this prompt's prefixes in: its cache scope, and its adapters (KV computed
        under one adapter set is never reused under another, app/engine/lora.py), by name and non-zero scale."""
        used = sorted((name, scale) for name, scale in self.adapters if scale != 0)
        if not used:
            return self.cache_scope
        return self.cache_scope + "\x1flora:" + ",".join(f"{name}*{scale!r}" for name, scale in used)

    def choice_seed(self, index: int) -> int | None:
        """Choice `index`'s seed: seeded requests stay reproducible, and their choices differ."""
        seed = self.sampling.seed
        return None if seed is None else seed + index



class Job(Generic[R]):
    """What a model's replica is asked besides a generation, answered once with an R: a small value that says
    what is asked (Models.run; EngineHost finds its handler by the job's type). The pooled jobs are here, the
    others in jobs.py."""

    __slots__ = ()


@dataclass(frozen=True)
class EmbeddingJob(Job["EmbeddingResult"]):
    """One /v1/embeddings request as its model's replica takes it (crosses the Ray hop as it is)."""

    request_id: str
    # Each input: a text (tokenized by the model, its special tokens added) or token ids (used as they are).
    inputs: tuple[str | tuple[int, ...], ...]
    # True when the request sent one input rather than a list: errors then name `input`, not `input[0]`.
    single: bool = False
    # Keep only the last k tokens of a longer input (vLLM's truncate_prompt_tokens; -1: the model's context).
    # None: an input longer than the context is refused.
    truncate: int | None = None
    dimensions: int | None = None  # keep the first k components (a Matryoshka model), then normalize
    max_total_tokens: int | None = None  # over all inputs, after truncation


@dataclass(frozen=True)
class EmbeddingResult:
    vectors: tuple[Any, ...]  # one float32 numpy array per input, in order
    prompt_tokens: int


@dataclass(frozen=True)
class RerankJob(Job["RerankResult"]):
    """One /v1/rerank request as its reranker's replica takes it: the query paired with each document, each
    pair one sequence of the embedding engine (rank pooling: one relevance score per sequence)."""

    request_id: str
    query: str
    documents: tuple[str, ...]
    # Cut a pair longer than k tokens (-1: the model's context) at its document's end instead of refusing it
    # (vLLM's truncate_prompt_tokens). None: a pair longer than the context is refused.
    truncate: int | None = None
    max_total_tokens: int | None = None  # over all pairs, after truncation


@dataclass(frozen=True)
class RerankResult:
    scores: tuple[float, ...]  # one per document, in the request's order
    prompt_tokens: int
