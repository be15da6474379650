"""What Ollama's clients read about models: /api/tags (the models the key may use), /api/show (one model's card),
/api/ps (those loaded now), /api/version. Names as names.py lists them; everything from the model's spec (its
GGUF header's entries, its context, its template), nothing from a file read per request.

- `details`: `family` the GGUF's architecture, `parameter_size` from its parameter count (or size label),
  `quantization_level` from its file type; `parent_model` the base of a LoRA adapter (a tag of its base).
- `digest`: a stable hash of the model's id, not of its file (no file is hashed per request).
- `model_info`: the GGUF header's scalar entries, with `<architecture>.context_length` the context this server
  serves the model with (its config's `n_ctx`, what a client may send), not the one it was trained for.
- `capabilities`: `completion` and `tools` for a chat model (tools go through the template or our fallback),
  `vision` with a projector, `thinking` with a reasoning parser, `embedding` for an embedding model. Rerankers have
  no Ollama route and are not listed.
- /api/ps: models with a deployment of their own (always loaded; `expires_at` far away) and pooled models loaded
  on a replica now; `size_vram` is not measured here (0)."""

from __future__ import annotations

import hashlib
import time
from datetime import datetime, timezone
from typing import Any

from ..config.spec import ModelSpec
from ..generation.caller import Caller
from ..pools.admin import PoolAdmin, PoolModelsRequest
from ..prompt.tool_calling import resolve_reply_format
from ..tenants.access import may_use
from .errors import model_not_found
from .names import listed_name, resolved
from .schemas import OllamaPsRequest, OllamaShowRequest, OllamaTagsRequest, OllamaVersionRequest

OLLAMA_API_VERSION = "0.12.0"
"""The Ollama version whose API these routes follow (clients gate features on /api/version), not llamaray's own."""

NEVER = "9999-12-31T23:59:59Z"
SERVED_KINDS = ("chat", "embedding")  # the kinds an Ollama route serves

# llama.cpp's `general.file_type` (enum llama_ftype) as Ollama names the quantization.
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
              12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
              19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
              26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
              36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4"}


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def parameter_size(info: dict[str, Any]) -> str:
    count = info.get("general.parameter_count")
    if isinstance(count, int) and count > 0:
        for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
            if count >= scale:
                return f"{count / scale:.1f}{unit}"
        return str(count)
    label = info.get("general.size_label")
    return label if isinstance(label, str) else ""


def details(spec: ModelSpec, parent: str = "") -> dict[str, Any]:
    info = dict(spec.gguf_info)
    family = info.get("general.architecture", "")
    file_type = info.get("general.file_type")
    return {"parent_model": parent, "format": "gguf", "family": family, "families": [family] if family else None,
            "parameter_size": parameter_size(info),
            "quantization_level": FILE_TYPES.get(file_type, "") if isinstance(file_type, int) else ""}


class OllamaCatalogue:
    def __init__(self, specs: list[ModelSpec], pools: PoolAdmin | None = None) -> None:
        self.models = {s.id: s for s in specs}
        self.pools = pools
        self.modified_at = _iso(time.time())
        # (listed id, its spec, its base's id for an adapter) of every model an Ollama route serves
        self.entries = [(s.id, s, "") for s in specs if s.kind in SERVED_KINDS]
        self.entries += [(f"{s.id}:{a.name}", s, s.id) for s in specs if s.kind == "chat" for a in s.adapters]
        self.ids = [model_id for model_id, _, _ in self.entries]

    def _allowed(self, caller: Caller) -> list[tuple[str, ModelSpec, str]]:
        out = []
        for model_id, spec, base in self.entries:
            adapters = ((model_id[len(base) + 1:], 1.0),) if base else ()
            if may_use(caller.policy, spec.id, adapters):
                out.append((model_id, spec, base))
        return out

    def _entry(self, model_id: str, spec: ModelSpec, base: str) -> dict[str, Any]:
        name = listed_name(model_id, self.ids)
        return {"name": name, "model": name, "modified_at": self.modified_at, "size": spec.file_bytes,
                "digest": hashlib.sha256(model_id.encode()).hexdigest(),
                "details": details(spec, listed_name(base, self.ids) if base else "")}

    async def tags(self, request: OllamaTagsRequest, caller: Caller) -> dict[str, Any]:
        return {"models": [self._entry(*entry) for entry in self._allowed(caller)]}

    async def ps(self, request: OllamaPsRequest, caller: Caller) -> dict[str, Any]:
        loaded: dict[str, bool] = {}  # pooled model -> pinned, for those a replica holds loaded
        if self.pools is not None and self.pools.pools:
            for card in (await self.pools.list(PoolModelsRequest(), caller))["data"]:
                if card["state"] == "loaded":
                    loaded[card["id"]] = card["pinned"]
        out = []
        for model_id, spec, base in self._allowed(caller):
            if spec.pool and spec.id not in loaded:
                continue
            entry = self._entry(model_id, spec, base)
            del entry["modified_at"]
            out.append({**entry, "expires_at": NEVER, "size_vram": 0, "context_length": spec.n_ctx})
        return {"models": out}

    async def show(self, request: OllamaShowRequest, caller: Caller) -> dict[str, Any]:
        request = resolved(self.models, request, caller)
        entry = next((e for e in self.entries if e[0] == request.model), None)
        if entry is None:  # a reranker: no Ollama route serves it
            raise model_not_found(request.name)
        model_id, spec, base = entry
        info = dict(spec.gguf_info)
        arch = info.get("general.architecture", "")
        if arch:
            info[f"{arch}.context_length"] = spec.n_ctx
        parameters = [f"num_ctx {spec.n_ctx}"]
        if spec.default_max_tokens is not None:
            parameters.append(f"num_predict {spec.default_max_tokens}")
        body = {"modelfile": f"# Served by llamaray from its config: model {model_id!r}.\nFROM {request.name}\n",
                "parameters": "\n".join(parameters), "template": spec.chat_template,
                "details": details(spec, listed_name(base, self.ids) if base else ""), "model_info": info,
                "capabilities": capabilities(spec), "modified_at": self.modified_at}
        if isinstance(info.get("general.license"), str):
            body["license"] = info["general.license"]
        return body

    async def version(self, request: OllamaVersionRequest, caller: Caller) -> dict[str, Any]:
        return {"version": OLLAMA_API_VERSION}


def capabilities(spec: ModelSpec) -> list[str]:
    if spec.kind == "embedding":
        return ["embedding"]
    caps = ["completion", "tools"]
    if spec.takes_images:
        caps.append("vision")
    if resolve_reply_format(spec.chat_template, spec.reasoning_parser, spec.tool_parser).reasoning != "none":
        caps.append("thinking")
    return caps
