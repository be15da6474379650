"""The serve application's `args`: its models and pools (schema.py), limits, auth, tracing and topology, validated
by pydantic; `parse_args` turns any problem into one ConfigError line naming the key."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .pools import expand_pools
from .schema import ConfigError, ModelConfig, PoolConfig

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
    # An editor's ring of recently seen chunks (llama.vim keeps 16 to 64); their bytes are the body's.
    max_infill_extra: int = Field(256, ge=0, description="most `input_extra` files in one /infill request")
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


class BatchConfig(BaseModel):
    """Batch jobs (OpenAI's Files and Batches API, Anthropic's Message Batches: app/batches/): where their files
    and state are kept, what one file and one key may hold, and how the runner sends their lines."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    enabled: bool = Field(True, description="serve /v1/files, /v1/batches and /v1/messages/batches")
    storage: str | None = Field(
        None, description="where files, batch state and results are kept: a directory or an fsspec URL (s3://, "
        "gs://...) every node reaches; default $LLAMARAY_BATCH_STORAGE, else ~/.cache/llamaray/batches (one "
        "machine: a cluster needs a shared one)")
    max_file_bytes: int = Field(200 * 1024 * 1024, ge=1024, description="largest upload (OpenAI's limit)")
    max_lines: int = Field(50_000, ge=1, le=10_000_000, description="most requests in one batch (OpenAI's limit)")
    max_line_bytes: int | None = Field(None, ge=1024, description="largest line of an input file (default: "
                                       "limits.max_body_bytes, what one request's body may be)")
    max_open_batches_per_key: int = Field(16, ge=1, description="batches a key may have not yet ended; one more "
                                          "is a 429")
    max_files_per_key: int = Field(1000, ge=1, description="files a key may keep; one more upload is a 429")
    max_bytes_per_key: int = Field(10 * 1024 ** 3, ge=1024, description="what a key's files may take together")
    lines_per_model: int | None = Field(None, ge=1, description="a model's batch lines in flight at most (default: "
                                        "its n_seq_max; with topology graph one less, so that an interactive "
                                        "request always finds room in Serve's queue in front of a replica)")
    max_attempts: int = Field(5, ge=1, le=100, description="tries of a line that fails with a retryable error "
                              "(a 5xx; a 429 and a slot given to interactive work are waited out, not counted)")
    completion_window_s: float = Field(86400.0, gt=0, description="what `completion_window: 24h` gives a batch "
                                       "before it expires (its finished lines kept)")
    chunk_lines: int = Field(64, ge=1, le=100_000, description="results written in one atomic chunk at most")
    chunk_s: float = Field(2.0, gt=0, le=3600, description="a chunk of results written at least this often")


class AppArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    models: list[ModelConfig] = Field(default_factory=list)
    pools: list[PoolConfig] = Field(default_factory=list, description="pools of models loaded on demand "
                                    "(docs/configuration.md, Model pools)")
    limits: Limits = Field(default_factory=Limits)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    batch: BatchConfig = Field(default_factory=BatchConfig)
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


def parse_args(raw: dict[str, Any] | None) -> AppArgs:
    try:
        return AppArgs.model_validate(raw or {})
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"]) or "args"
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        raise ConfigError(f"invalid application args at `{where}`: {msg}") from None
