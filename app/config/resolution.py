"""Each model entry resolved to a `ModelSpec`: an absolute GGUF path that exists, or a remote source
(app/model_sources) that each node running the model fetches; the chat template (from the GGUF, read here in full
or, for a remote source, by its header alone, unless configured) and the special tokens the template needs; its
projector, draft model and adapters likewise. Every problem raises `ConfigError` with one line that names the
model and the field."""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..model_sources.cache import cache_root
from ..model_sources.fetch import FetchError
from ..model_sources.gguf import GGUFError, control_token_texts, read_metadata, special_token_text
from ..model_sources.header import pin, read_header
from ..model_sources.quant import QuantError
from ..model_sources.redact import redacted
from ..model_sources.source import ModelSource, parse_source
from .paths import resolve_path
from .schema import CHATML_TEMPLATE, ConfigError, ModelConfig, SpeculativeConfig, SyntheticSettings
from .spec import AdapterSpec, ModelSpec, SpeculativeSpec

if TYPE_CHECKING:  # a name only: app_args.py is above this module
    from .app_args import AppArgs

log = logging.getLogger("llamaray.config")

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
        where["file_bytes"] = path.stat().st_size
    where["gguf_info"] = gguf_info(meta)
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


MAX_INFO_TEXT = 1024  # longer header strings (a license's full text) describe nothing a client reads


def gguf_info(meta: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The header's scalar entries, sorted (ModelSpec.gguf_info): no arrays (the vocabulary), no chat template (the
    spec has it), no long text."""
    return tuple(sorted((k, v) for k, v in meta.items()
                        if isinstance(v, (str, int, float, bool)) and k != "tokenizer.chat_template"
                        and not (isinstance(v, str) and len(v) > MAX_INFO_TEXT)
                        and not (isinstance(v, float) and not math.isfinite(v))))


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
        cache_type_k=cfg.cache_type_k, cache_type_v=cfg.cache_type_v,
        kv_disk_dir=(cfg.kv_cache.disk_dir if cfg.kv_cache.disk else ""), kv_disk_mib=cfg.kv_cache.disk_mib,
        kv_store=cfg.kv_cache.store or "", kv_min_tokens=cfg.kv_cache.min_tokens,
        reasoning_budget=cfg.reasoning_budget, reasoning_budgets=tuple(cfg.reasoning_budgets.model_dump().items()),
        reasoning_close=cfg.reasoning_close,
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


def resolve_models(args: AppArgs) -> list[ModelSpec]:
    return [replace(resolve_model(m, args.model_cache), model_cache=args.model_cache) for m in args.models]
