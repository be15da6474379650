"""`POST /infill` as data: llama-server's fill-in-the-middle request, as editors send it (llama.vim, llama.vscode,
Continue, Tabby, Twinny): the text before and after the cursor, other files for context, and the completion's
sampling in llama-server's /completion names.

Sizes are bounded before any work: the body's (limits.max_body_bytes) bounds the text, and planning refuses more
than limits.max_infill_extra files (app/completions/infill.py); every file is a small object read once."""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, Field, field_validator

from .schemas import InfillChunk, LoraEntry, MAX_LORA_ENTRIES, _Model, check_cache_salt, check_stop


class InfillRequest(_Model):
    # Optional, as editors leave it out against a one-model llama-server: then the only chat model the key may use.
    model: str | None = Field(default=None, min_length=1)
    input_prefix: str
    input_suffix: str
    input_extra: list[InfillChunk] | None = None
    prompt: str = ""  # what the completion starts with, after the prefix (read for control tokens)
    # llama-server's `n_predict` (-1: until the model stops or the context is full); `max_tokens` is its alias there.
    n_predict: int | None = Field(default=None, ge=-1, validation_alias=AliasChoices("n_predict", "max_tokens"))
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_k: int | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repeat_penalty: float | None = Field(default=None, gt=0, le=10)
    stop: str | list[str] | None = None
    grammar: str | None = None
    # llama-server's sampler order; only `infill` changes anything here (llama.cpp's infill sampler, before the
    # final pick): the chain's order is llamaray's own (docs/api.md).
    samplers: list[str] | None = Field(default=None, max_length=16)
    # Editors' stops: the first generated line indented less than n_indent ends the completion (cut before its
    # text); t_max_predict_ms: after the first new line, the completion ends once it has run this long.
    n_indent: int = Field(default=0, ge=0, le=1_000_000)
    t_max_predict_ms: int | None = Field(default=None, ge=-1)
    t_max_prompt_ms: int | None = Field(default=None, ge=-1)  # accepted: llama-server does not apply it either
    id_slot: int | None = None  # accepted: this server picks the slot (the one holding the longest prefix)
    response_fields: list[str] | None = Field(default=None, max_length=64)
    return_tokens: bool = False
    cache_prompt: bool | None = None
    cache_salt: str | None = None
    lora: list[LoraEntry] | None = Field(default=None, max_length=MAX_LORA_ENTRIES)

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        return check_stop(v)

    @field_validator("cache_salt")
    @classmethod
    def _cache_salt(cls, v: str | None) -> str | None:
        return check_cache_salt(v)

    @field_validator("response_fields")
    @classmethod
    def _fields(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any(len(f) > 256 for f in v):
            raise ValueError("each response field is a path of at most 256 characters")
        return v

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def extra(self) -> tuple[tuple[str, str], ...]:
        return tuple((chunk.filename, chunk.text) for chunk in self.input_extra or [])


def nested_fields(paths: list[str], body: dict[str, Any]) -> dict[str, Any]:
    """llama-server's `response_fields`: the values at the given paths (`timings/prompt_n`), keyed by the path;
    paths that lead nowhere are left out."""
    out: dict[str, Any] = {}
    for path in paths:
        value: Any = body
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out
