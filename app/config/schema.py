"""The schema of a model's and a pool's entries in the app's args (`models:`, `pools:`), validated by pydantic, with
the ids' rules and the error every config problem is told as (one line naming the model and the field).

The app's other args (limits, auth, tracing, topology) are app_args.py's; what an entry resolves to (a ModelSpec)
is spec.py's, and how (GGUF metadata, remote sources) resolution.py's."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..model_sources.redact import redacted
from ..model_sources.source import parse_source

MODEL_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$")
# An adapter's name follows its base's id after a colon (`<base>:<adapter>`), so it holds no colon itself.
ADAPTER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# The largest |scale| an adapter is applied at (config and requests): far past any useful strength (1 is the
# adapter as trained), short of the overflow a huge factor brings to the activations.
MAX_ADAPTER_SCALE = 10.0


class ConfigError(ValueError):
    """A configuration problem, phrased as one line for the person running `serve run` (credentials in a
    source URL hidden: the line goes to logs and to check-config's output)."""

    def __init__(self, message: str) -> None:
        super().__init__(redacted(message))


class AdapterConfig(BaseModel):
    """A LoRA adapter GGUF of a chat model (app/engine/lora.py): loaded by every replica of the model at start,
    asked for as `model: "<base>:<name>"` or in a request's `lora` list."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(description="what requests call it: `model: \"<model id>:<name>\"`")
    path: str = Field(description="the adapter GGUF, in the forms of model_path (a file, pkg:, hf://, s3://, gs://, "
                                  "https://); fetched by each node that runs the model")
    scale: float = Field(1.0, ge=-MAX_ADAPTER_SCALE, le=MAX_ADAPTER_SCALE,
                         description="the scale it is applied at when a request names it by `model` (a request's "
                                     "`lora` list may give another); 0: the base model")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not ADAPTER_NAME_RE.match(v):
            raise ValueError("adapter name must be 1-64 chars of letters, digits, '_', '.', '-' (no ':': it follows "
                             "the model id after one)")
        return v

    @field_validator("path")
    @classmethod
    def _source(cls, v: str) -> str:
        source = parse_source(v)
        if source.kind == "hf" and source.filename is None:
            raise ValueError("name the adapter's file (hf://<org>/<repo>/<file.gguf>), not a quantization")
        return v


class SpeculativeConfig(BaseModel):
    """Speculative decoding of a chat model (app/engine/speculation.py): drafts verified in the step's batch,
    the output unchanged (greedy: the same tokens; sampling: the same distribution)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: Literal["ngram", "draft", "none"] = Field(
        "ngram", description="`ngram`: prompt lookup (drafts copied from the sequence's own prompt and output); "
                             "`draft`: proposed by `draft_model`; `none`: off")
    draft_model: str | None = Field(None, description="`type: draft`: a smaller GGUF sharing the model's "
                                                      "vocabulary, in the forms of model_path; loaded beside the "
                                                      "model on each replica, with the same threads, layers and "
                                                      "slots")
    n_max: int = Field(8, ge=1, le=64, description="most draft tokens a sequence verifies in one step "
                                                  "(llama-server's speculative.n_max)")
    n_min: int = Field(0, ge=0, le=64, description="fewer proposed drafts than this are not verified "
                                                  "(llama-server's speculative.n_min)")
    ngram_max: int = Field(3, ge=1, le=16, description="longest n-gram looked up")
    ngram_min: int = Field(2, ge=1, le=16, description="shortest n-gram looked up")
    max_sequences: int = Field(4, ge=1, le=256, description="no drafts in a step that decodes more sequences than "
                                                            "this: a large batch is already efficient, drafts cost "
                                                            "more than they give there")
    adaptive: bool = Field(True, description="verify a sequence's drafts only where its measured acceptance and "
                                             "the replica's measured step cost say they gain tokens per second "
                                             "(a CPU pays for every row, a GPU hardly); false: verify every "
                                             "proposal, up to n_max")

    @model_validator(mode="after")
    def _ranges(self) -> "SpeculativeConfig":
        if self.ngram_min > self.ngram_max:
            raise ValueError("`ngram_min` must not exceed `ngram_max`")
        if self.n_min > self.n_max:
            raise ValueError("`n_min` must not exceed `n_max`")
        if (self.type == "draft") != (self.draft_model is not None):
            raise ValueError("`type: draft` needs `draft_model`, and only it takes one")
        return self

    @field_validator("draft_model")
    @classmethod
    def _draft_source(cls, v: str | None) -> str | None:
        if v is not None:
            parse_source(v)  # SourceError is a ValueError: pydantic reports it at the field
        return v


KV_CACHE_TYPES = ("f16", "q8_0", "q4_0")
"""KV cache types a model's entry may ask for (llama-server's -ctk/-ctv): bytes per element 2, 34/32, 18/32."""


class KVCacheConfig(BaseModel):
    """Where a chat model's prefilled KV is kept beyond its replica (app/kvstore): the node's disk and a store the
    cluster shares. Each entry is one sequence's state, keyed by the GGUF's content, the KV types and context, the
    adapters and the caller's cache scope."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    disk: bool = Field(True, description="keep states on this node's disk (a directory bounded by `disk_mib`, "
                                         "least recently used out); they outlive the replica")
    disk_dir: str | None = Field(None, description="the node's directory (default: $LLAMARAY_KV_CACHE, else "
                                                   "~/.cache/llamaray/kv); `~` and $VARS expanded on each node")
    disk_mib: float = Field(4096, gt=0, description="most MiB of states this model keeps on one node's disk")
    store: str | None = Field(None, description="an fsspec URL every replica of the model reads and writes (s3://, "
                                                "gs://, a shared filesystem's path): a replica that never saw a prompt "
                                                "restores what another one prefilled")
    min_tokens: int = Field(256, ge=32, description="shorter prompts are not kept beyond memory (prefilling them "
                                                    "costs less than a file), nor a prompt that adds fewer tokens "
                                                    "than this to a stored entry covering the rest of it")

    @field_validator("store")
    @classmethod
    def _store_url(cls, v: str | None) -> str | None:
        if v is not None and ("\n" in v or not v.strip()):
            raise ValueError("`store` must be an fsspec URL or path")
        return v


# What the engine writes before a reasoning's end marker when its budget is spent (Qwen's own words for its
# thinking budget): a bare cut leaves the model mid-thought, a conclusion lets it answer from what it thought.
DEFAULT_REASONING_CLOSE = ("\n\nConsidering the limited time by the user, I have to give the solution based on the "
                           "thinking directly now.\n")
MAX_REASONING_CLOSE_CHARS = 1000


class ReasoningBudgets(BaseModel):
    """The reasoning budget each effort a request names stands for (OpenAI's `reasoning_effort`, the Responses
    API's `reasoning.effort`): tokens the model may reason for before the engine closes its reasoning; null:
    unbounded. `none` is always 0 (no reasoning)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    minimal: int | None = Field(128, ge=0)
    low: int | None = Field(1024, ge=0)
    medium: int | None = Field(4096, ge=0)
    high: int | None = Field(16384, ge=0)
    xhigh: int | None = Field(None, ge=0)


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    id: str = Field(description="the `model` name clients send")
    kind: Literal["chat", "embedding", "rerank"] = Field(
        "chat", description="`chat`: a generating model (chat and legacy completions); `embedding`: an embedding "
                            "model, served on /v1/embeddings; `rerank`: a reranker (a GGUF with rank pooling), "
                            "served on /v1/rerank")
    model_path: str | None = Field(None, description="the GGUF (required for `engine: llama`): a file path on every "
                                   "node that runs it; pkg:<package>/<file> (shipped in a package); "
                                   "hf://<org>/<repo>/<file.gguf>[@<revision>] or <org>/<repo>:<quant>[@<revision>] "
                                   "(the Hugging Face Hub); s3://, gs:// or https:// URLs. Remote sources are "
                                   "fetched by each node that runs the model, once, into its model cache")
    sha256: str | None = Field(None, description="the GGUF's sha256 (of the first part, for a split model): a "
                                                 "replica refuses a file that does not match")
    mmproj_path: str | None = Field(None, description="a multimodal projector GGUF, in the forms of model_path "
                                                      "(fetched along with the model)")
    engine: Literal["llama", "synthetic"] = Field(
        "llama", description="`llama`: the GGUF on llama.cpp; `synthetic`: no model, tokens at the rates of "
                             "`synthetic` (capacity planning of the graph at a GPU's speed on any machine)")
    synthetic: SyntheticSettings | None = Field(None, description="rates of a synthetic engine")
    n_ctx: int = Field(4096, ge=64, description="context window per request, in tokens")
    n_seq_max: int = Field(4, ge=1, le=256, description="sequence slots served at once by one replica")
    n_batch: int = Field(512, ge=16, description="max tokens per llama_decode call")
    n_threads: int | None = Field(None, ge=1, description="decode threads (default: the CPUs Ray reserved for "
                                                          "the replica, at least 1)")
    n_threads_batch: int | None = Field(None, ge=1, description="prompt threads (default: n_threads)")
    n_gpu_layers: int | Literal["auto"] | None = Field(
        None, description="layers offloaded to the GPU, -1 for all; auto (the default): all when Ray gave the "
                          "replica a GPU, none otherwise")
    kv_unified: bool = Field(False, description="one KV pool shared by all slots (default: a stream per slot)")
    prompt_cache_mib: float = Field(1024, ge=0, description="host memory for the KV of prompts whose slot was "
                                                            "reused, restored when they come back (0: off)")
    kv_cache: KVCacheConfig = Field(default_factory=KVCacheConfig, description="the KV kept beyond the replica: "
                                    "the node's disk (on by default) and a store the cluster shares")
    cache_type_k: Literal["f16", "q8_0", "q4_0"] = Field("f16", description="the KV cache's type for keys "
                                                         "(llama-server's -ctk): q8_0 takes about half of f16")
    cache_type_v: Literal["f16", "q8_0", "q4_0"] = Field("f16", description="the KV cache's type for values "
                                                         "(llama-server's -ctv)")
    fair_share: bool = Field(True, description="when more requests wait than slots are free, the next slot goes to "
                             "the key (tenant) holding the fewest slots for its priority's weight, first come first "
                             "served within a key (false: first come, first served over all keys)")
    cpu_extra_buffers: Literal["auto", "on", "off"] = Field(
        "auto", description="llama.cpp's extra CPU weight buffers (repacked/AMX); auto: off only for an AMX "
                            "build on an AMX CPU (llama.cpp #20824)")
    startup_self_check: bool = Field(True, description="load and decode once in a child process before serving")
    chat_template: str | None = Field(None, description="Jinja chat template overriding the GGUF's")
    reasoning_parser: str = "auto"
    tool_parser: str = "auto"
    reasoning_budget: int | None = Field(None, ge=0, description="tokens a reply may reason for when its request "
                                         "names no budget nor effort (0: no reasoning; none: unbounded); a "
                                         "reasoning model's (`reasoning_parser` think) only")
    reasoning_budgets: ReasoningBudgets = Field(default_factory=ReasoningBudgets, description="the budget each "
                                                "`reasoning_effort` stands for (minimal, low, medium, high, xhigh)")
    reasoning_close: str = Field(DEFAULT_REASONING_CLOSE, max_length=MAX_REASONING_CLOSE_CHARS,
                                 description="what the engine writes before the end-of-reasoning marker when a "
                                             "reply's reasoning budget is spent")
    default_max_tokens: int | None = Field(None, ge=1, description="completion limit when a request sets none")
    max_tokens_limit: int | None = Field(None, ge=1, description="largest max_tokens a request may ask for (default: n_ctx)")
    stream_interval_ms: float = Field(25.0, ge=0, le=1000, description="coalescing window for streamed pieces")
    tool_continuation_rounds: int = Field(2, ge=0, le=10, description="extra rounds for a tool call cut by max_tokens")
    tool_continuation_tokens: int = Field(256, ge=1, description="tokens per continuation round")
    empty_reply: Literal["allow", "error"] = Field(
        "allow", description="a reply of nothing but whitespace: `allow` sends it (a valid answer), `error` "
                             "answers 502 upstream_empty_response instead; metrics count it as `empty` either way")
    routing: Literal["prefix", "load"] = Field(
        "prefix", description="how requests pick one of this model's replicas: `prefix` prefers the replica "
                              "most likely holding the prompt's longest prefix in its KV cache (falling back to "
                              "load when it is busy); `load` is Serve's default (power of two choices)")
    owned_by: str = "llamaray"
    adapters: list[AdapterConfig] | None = Field(
        None, description="LoRA adapters of this chat model (GGUF adapters made for its GGUF): each replica loads "
                          "them at start; a request names one as `model: \"<id>:<name>\"`, or several in `lora`")
    speculative: SpeculativeConfig | None = Field(
        None, description="speculative decoding (default: off); requests may turn it off (`speculative: false`) "
                          "or size it (`speculative.n_max`, `speculative.n_min`)")
    pool: str | None = Field(None, description="the `pools:` entry whose replicas load this model on demand (no "
                                               "deployment of its own)")
    # Embedding models (kind: embedding) only; `pooling` also for rerankers (kind: rerank), which need `rank`.
    pooling: Literal["mean", "cls", "last", "rank"] | None = Field(
        None, description="how token vectors become one vector per input (default: the GGUF's pooling_type); a "
                          "reranker's is `rank` (its classifier head scores each pair)")
    normalize: bool = Field(True, description="scale each vector to unit length (L2), as OpenAI's are")
    dimensions: list[int] | None = Field(
        None, min_length=1, description="vector sizes a request's `dimensions` may ask for: the prefixes the model "
                                        "was trained to keep meaning in (Matryoshka); none: no truncation")

    @model_validator(mode="after")
    def _kind_keys(self) -> "ModelConfig":
        """Keys that mean nothing for the model's kind are refused, not silently ignored."""
        given = self.model_fields_set
        wrong = {"embedding": CHAT_ONLY_KEYS, "rerank": CHAT_ONLY_KEYS + RERANK_REFUSED_KEYS}.get(
            self.kind, EMBEDDING_ONLY_KEYS)
        named = [k for k in wrong if k in given]
        if named:
            keys = ", ".join(f"`{k}`" for k in named)
            if self.kind == "embedding":
                raise ValueError(f"{keys} apply to chat models; model {self.id!r} is `kind: embedding` "
                                 f"(it serves /v1/embeddings: no template, no generation)")
            if self.kind == "rerank":
                raise ValueError(f"{keys} do not apply to model {self.id!r}: it is `kind: rerank` (it serves "
                                 f"/v1/rerank: one score per document, no template, no generation, no vectors)")
            raise ValueError(f"{keys} apply to `kind: embedding` models; model {self.id!r} is a chat model")
        if self.kind != "chat" and self.engine != "llama":
            raise ValueError(f"a `kind: {self.kind}` model runs on `engine: llama`")
        if self.pooling == "rank" and self.kind != "rerank":
            raise ValueError(f"`pooling: rank` makes a reranker; set `kind: rerank` on model {self.id!r}")
        if self.dimensions is not None and any(d < 1 for d in self.dimensions):
            raise ValueError("`dimensions` are vector sizes: positive integers")
        return self

    @model_validator(mode="after")
    def _engine_needs(self) -> "ModelConfig":
        if self.engine == "llama" and not self.model_path:
            raise ValueError("`model_path` is required (a GGUF file), unless `engine: synthetic`")
        if self.synthetic is not None and self.engine != "synthetic":
            raise ValueError("`synthetic` rates apply to `engine: synthetic` only")
        if self.adapters and self.engine != "llama":
            raise ValueError("`adapters` are applied by llama.cpp: they need `engine: llama`")
        names = [a.name for a in self.adapters or []]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"adapter {twice[0]!r} is configured twice on model {self.id!r}")
        return self

    @field_validator("reasoning_close")
    @classmethod
    def _close(cls, v: str) -> str:
        if "<think>" in v or "</think>" in v:
            raise ValueError("the closing message is written before the end marker: it must not hold `<think>` or "
                             "`</think>` itself")
        return v

    @field_validator("model_path", "mmproj_path")
    @classmethod
    def _source(cls, v: str | None) -> str | None:
        if v is not None:
            parse_source(v)  # SourceError is a ValueError: pydantic reports it at the field
        return v

    @field_validator("sha256")
    @classmethod
    def _sha256(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", v):
            raise ValueError("sha256 must be 64 hexadecimal digits")
        return v.lower() if v else v

    @field_validator("n_gpu_layers")
    @classmethod
    def _gpu_layers(cls, v: int | str | None) -> int | None:
        if v is None or v == "auto":
            return None
        if v < -1:
            raise ValueError("n_gpu_layers must be -1 (all), 0 (none), a layer count, or auto")
        return v

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not MODEL_ID_RE.match(v):
            raise ValueError("model id must be 1-128 chars of letters, digits, '_', '.', ':', '/', '-'")
        return v


CHAT_ONLY_KEYS = ("chat_template", "reasoning_parser", "tool_parser", "default_max_tokens", "max_tokens_limit",
                  "stream_interval_ms", "tool_continuation_rounds", "tool_continuation_tokens", "empty_reply",
                  "prompt_cache_mib", "kv_cache", "routing", "synthetic", "mmproj_path", "adapters", "fair_share",
                  "speculative", "reasoning_budget", "reasoning_budgets", "reasoning_close")
EMBEDDING_ONLY_KEYS = ("pooling", "normalize", "dimensions")
RERANK_REFUSED_KEYS = ("normalize", "dimensions")  # a reranker's output is a score, not a vector


class SyntheticSettings(BaseModel):
    """How fast a synthetic engine pretends to be (app/engine/synthetic.py): a preset, or measured figures."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    preset: Literal["h200-smollm2-135m"] = Field("h200-smollm2-135m", description="measured rates to start from")
    prefill_tokens_per_s: float | None = Field(None, gt=0, description="prompt tokens per second")
    step_ms: list[tuple[int, float]] | None = Field(
        None, min_length=1, description="[batch size, ms per decode step] pairs, measured (interpolated between)")


CHATML_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                   "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
"""The template of a synthetic model that names none."""


POOL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class PoolConfig(BaseModel):
    """A pool: one deployment (`LlamaPool-<name>`) whose replicas each hold up to `max_models` of its models,
    loaded on a model's first request and evicted least recently used (app/pools/manager.py)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(description="the pool's name; its deployment is LlamaPool-<name>")
    max_models: int = Field(2, ge=1, le=64, description="most models one replica holds loaded at once")
    memory_budget_mib: float | None = Field(None, gt=0, description="most memory (MiB) the models one replica holds "
                                            "may take together, each measured from its GGUF: the file's size plus "
                                            "its KV cache at n_ctx x n_seq_max (none: only max_models bounds them)")
    pinned: list[str] = Field(default_factory=list, description="model ids loaded when a replica starts and never "
                                                                "evicted")
    idle_unload_s: float = Field(0, ge=0, description="unload a model no request used for this long (0: only "
                                                      "evicted to make room)")
    failed_load_retry_s: float = Field(30, ge=0, le=3600, description="a model whose load failed (a corrupt GGUF, out "
                                       "of memory) is answered with that failure (503) for this long before a "
                                       "replica tries to load it again (0: every request tries)")
    room_wait_s: float = Field(30, ge=0, le=600, description="how long a request for a model that is not loaded "
                               "waits, when every model a replica holds is busy, pinned or loading, for one to go "
                               "idle (then evicted for it) before a 503 with Retry-After (0: the 503 at once)")
    claim_after_s: float = Field(5, ge=0, le=600, description="once such a request has waited this long, the held "
                                 "model with the fewest requests stops taking new ones (they wait with it) until "
                                 "it goes idle and is evicted for it: a cold model is not starved by a busy one's "
                                 "stream of requests (0: at once, at the cost of more loads)")
    catalogue: str | None = Field(None, description="a directory, laid out as llama-server's --models-dir: every "
                                                    "<id>.gguf in it is a model of this pool (a split model's parts "
                                                    "count once), a projector beside it (mmproj-<id>.gguf) its "
                                                    "mmproj_path; a subdirectory with one model's GGUF is a model "
                                                    "named after it, an mmproj*.gguf in it its projector. An entry "
                                                    "of `models` with that id and `pool` configures it instead")
    hub: list[str] = Field(default_factory=list, description="Hugging Face Hub GGUFs of this pool, each "
                           "<org>/<repo>:<quant> (the repo's GGUF of that quantization) or hf://<org>/<repo>/<file.gguf>, "
                           "with an optional @<revision>: each a model whose id is the source without its revision "
                           "(`<org>/<repo>:<quant>`, or `<org>/<repo>/<file>` without .gguf), fetched by the "
                           "replica that first loads it. An entry of `models` with that id and `pool` configures it "
                           "instead")
    model_defaults: dict[str, Any] = Field(default_factory=dict, description="model-entry keys for the catalogue's "
                                           "and the hub list's models (n_ctx, n_seq_max, n_threads...)")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not POOL_NAME_RE.match(v):
            raise ValueError("pool name must be 1-64 chars of letters, digits, '_', '.', '-'")
        return v
