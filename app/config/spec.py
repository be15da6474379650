"""What a model's entry resolves to, once, at build time (`ModelSpec`, with its adapters and speculative settings),
what the deployments and engines read; the auto values a replica decides where it lands (`place`); a model's
deployment name.

Two values are left open ("auto", None) at build time because they depend on where a replica lands, not on the
node that builds the app: `n_gpu_layers` (all layers when the replica was given a GPU, none otherwise) and
`n_threads` (the CPUs reserved for the replica). `place` fills them in, in the replica, from plain values the Ray
wiring passes in."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace

from .schema import DEFAULT_REASONING_CLOSE, ReasoningBudgets

DEFAULT_REASONING_BUDGETS = tuple(ReasoningBudgets().model_dump().items())


@dataclass(frozen=True)
class AdapterSpec:
    """A LoRA adapter of a model, resolved: a local `path`, or a remote `source` (pinned) that each replica
    fetches into its node's cache, `path` "" until then."""

    name: str
    path: str
    scale: float = 1.0
    source: str = ""


@dataclass(frozen=True)
class SpeculativeSpec:
    """ModelConfig.speculative, resolved (type `none` is no SpeculativeSpec at all)."""

    type: str = "ngram"
    n_max: int = 8
    n_min: int = 0
    ngram_max: int = 3
    ngram_min: int = 2
    max_sequences: int = 4
    adaptive: bool = True
    draft_path: str = ""    # type draft: the draft GGUF, a local file (the replica fetches draft_source)
    draft_source: str = ""  # a remote draft's source, pinned


@dataclass(frozen=True)
class ModelSpec:
    """What the deployments need about one model, resolved once at build time. `n_threads`,
    `n_threads_batch` and `n_gpu_layers` may still be None ("auto"): `place` resolves them where the
    model runs."""

    id: str
    path: str
    n_ctx: int
    n_seq_max: int
    n_batch: int
    n_threads: int | None
    n_threads_batch: int | None
    n_gpu_layers: int | None
    kv_unified: bool
    cpu_extra_buffers: str
    startup_self_check: bool
    chat_template: str
    bos_token: str
    eos_token: str
    reasoning_parser: str
    tool_parser: str
    default_max_tokens: int | None
    max_tokens_limit: int | None
    stream_interval_ms: float
    tool_continuation_rounds: int
    tool_continuation_tokens: int
    owned_by: str
    n_vocab: int = 0  # tokens in the model's vocabulary (from the GGUF; 0 if it lists none)
    empty_reply: str = "allow"  # "allow" or "error" (ModelConfig.empty_reply)
    prompt_cache_mib: float = 1024.0  # ModelConfig.prompt_cache_mib
    cache_type_k: str = "f16"  # ModelConfig.cache_type_k / _v
    cache_type_v: str = "f16"
    # ModelConfig.kv_cache: the node's directory ("" with `disk: false`: no disk tier; None: the default, decided
    # on the node), its bound, the cluster's store ("": none) and the shortest state kept.
    kv_disk_dir: str | None = None
    kv_disk_mib: float = 4096.0
    kv_store: str = ""
    kv_min_tokens: int = 256
    fair_share: bool = True  # ModelConfig.fair_share
    speculative: SpeculativeSpec | None = None  # ModelConfig.speculative; None: off
    engine: str = "llama"  # ModelConfig.engine
    # engine synthetic: (prefill tokens/s, ((batch, ms per step), ...)), app/engine/synthetic.py
    synthetic: tuple[float, tuple[tuple[int, float], ...]] | None = None
    # Texts of the vocabulary's control tokens (GGUF token types CONTROL, UNKNOWN): prompt_check's
    # list of what client text must never become; () turns that check off.
    control_tokens: tuple[str, ...] = ()
    # A remote model: `source` is what each replica fetches (a Hub file pinned to a commit), `path` is
    # "" until it has. `sha256` is checked by the replica, whatever the source.
    source: str = ""
    sha256: str | None = None
    mmproj_source: str = ""  # a remote multimodal projector, fetched like `source`
    mmproj_path: str = ""  # the projector's local file (once fetched)
    model_cache: str | None = None  # AppArgs.model_cache
    # Where the builder found the metadata: "file" (a local GGUF), "header" (a remote GGUF's header, by
    # range reads) or "config" (the header was not readable: `metadata_note` says why; config values only).
    metadata_from: str = "file"
    metadata_note: str = ""
    # The GGUF header's scalar entries (architecture, parameter count, file type, context length...), sorted by
    # key, for what describes the model to clients (Ollama's /api/show and /api/tags); () when it was not read.
    gguf_info: tuple[tuple[str, str | int | float | bool], ...] = ()
    file_bytes: int = 0  # the GGUF's size (0: a remote file, not fetched by the builder)
    kind: str = "chat"  # ModelConfig.kind: "chat", "embedding" or "rerank"
    # kind embedding: llama.cpp's pooling ("mean", "cls", "last"), unit-length vectors, the sizes a request
    # may truncate them to (Matryoshka), and the model's own vector size. kind rerank: pooling "rank".
    pooling: str = ""
    normalize: bool = True
    dimensions: tuple[int, ...] = ()
    n_embd: int = 0
    adapters: tuple[AdapterSpec, ...] = ()  # LoRA adapters every replica loads at start (ModelConfig.adapters)
    # ModelConfig.reasoning_*: the budget when a request names none (None: unbounded), each effort's budget as
    # (effort, budget) pairs, and the message written before the end marker when a budget is spent.
    reasoning_budget: int | None = None
    reasoning_budgets: tuple[tuple[str, int | None], ...] = DEFAULT_REASONING_BUDGETS
    reasoning_close: str = DEFAULT_REASONING_CLOSE

    def adapter(self, name: str) -> AdapterSpec | None:
        return next((a for a in self.adapters if a.name == name), None)
    pool: str = ""  # ModelConfig.pool: served by that pool's replicas, not a deployment of its own

    @property
    def keeps_prompt_kv(self) -> bool:
        """Whether its engine keeps prompts' KV beyond their slots (a llama.cpp chat model with its file here: the
        prompt cache in host memory, the KV tiers beyond it)."""
        return self.kind == "chat" and self.engine == "llama" and bool(self.path)

    @property
    def takes_images(self) -> bool:
        """Whether requests may carry images: the model has a multimodal projector (local or fetched)."""
        return bool(self.mmproj_path or self.mmproj_source)



def place(spec: ModelSpec, *, cpus: float | None = None, gpus: int = 0) -> ModelSpec:
    """`spec` with its auto values decided for the process that runs it: `cpus` reserved for it (None:
    not known, use this node's cores) and the number of `gpus` assigned to it. Explicit values stay."""
    cores = os.cpu_count() or 1
    threads = spec.n_threads
    if threads is None:
        threads = cores if cpus is None else min(cores, max(1, math.floor(cpus + 0.5)))
    layers = spec.n_gpu_layers if spec.n_gpu_layers is not None else (-1 if gpus > 0 else 0)
    return replace(spec, n_threads=threads, n_threads_batch=spec.n_threads_batch or threads, n_gpu_layers=layers)


def deployment_name(model_id: str) -> str:
    """Name of a model's LlamaModel deployment, as written in serve_config.yaml."""
    return "LlamaModel-" + re.sub(r"[^A-Za-z0-9_.-]", "_", model_id)
