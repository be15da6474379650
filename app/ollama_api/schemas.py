"""Ollama's API requests as data: `/api/chat`, `/api/generate`, `/api/embed`, `/api/embeddings`, `/api/show`, and
the bodiless `/api/tags`, `/api/ps`, `/api/version`.

Strict: an unknown field or a value of the wrong JSON type is a 400 naming it (Ollama's server ignores unknown
fields; here a field that would change the answer must not be dropped). What Ollama has and this server cannot do
is a 400 that says so: image generation (`width`, `height`, `steps`), a Go `template` override (the model's chat
template is its GGUF's), `context` token lists (send the conversation to /api/chat) and `logprobs`. `suffix` on
/api/generate is fill-in-the-middle from the GGUF's own FIM tokens, as `suffix` on /v1/completions.

Each request names its model as the client sent it; the Ingress resolves it to a configured id
(app/ollama_api/names.py) before anything else reads it, and the client's spelling is what replies echo."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from ..api.errors import invalid_request
from ..api.schemas import parse_request

MAX_IMAGES_FIELD = 64  # images in one `images` list, before the server's own limits.max_images says more


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Named(_Strict):
    """A request that names a model: `model` as the client sent it until resolved (`with_model`), then the
    configured id, the client's spelling kept for replies (`name`)."""

    model: str = Field(min_length=1, max_length=512)
    _sent: str = PrivateAttr(default="")

    def with_model(self, model_id: str) -> "_Named":
        """This request naming the configured id `model_id` (replies still echo the client's name)."""
        if model_id == self.model:
            return self
        resolved = self.model_copy(update={"model": model_id})
        resolved._sent = self.name
        return resolved

    @property
    def name(self) -> str:
        """The model's name as the client sent it."""
        return self._sent or self.model


KeepAlive = int | float | str | None  # read by options.keep_alive_seconds (seconds, or a Go duration)
Format = Literal["", "json"] | dict[str, Any] | None


class _Generating(_Named):
    stream: bool = True  # Ollama streams unless told not to
    format: Format = None
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None
    think: bool | Literal["low", "medium", "high"] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    # what the lifecycle asks of every generating request
    @property
    def cache_salt(self) -> None:
        return None

    @property
    def include_usage(self) -> bool:
        return False  # the counts ride in the final record


class FunctionCall(_Strict):
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    index: int | None = None


class ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCall


class Message(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    thinking: str | None = None
    images: list[str] | None = Field(default=None, max_length=MAX_IMAGES_FIELD)
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class OllamaChatRequest(_Generating):
    """`POST /api/chat`; no `messages` (or none): load the model (or, with `keep_alive: 0`, unload it)."""

    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None  # OpenAI's function tools, as Ollama takes them: the chat request checks


class OllamaGenerateRequest(_Generating):
    """`POST /api/generate`; an empty prompt (and no system): load the model (or, with `keep_alive: 0`, unload it)."""

    prompt: str = ""
    system: str | None = None
    raw: bool = False
    images: list[str] | None = Field(default=None, max_length=MAX_IMAGES_FIELD)
    suffix: str | None = None
    template: str | None = None
    context: list[int] | None = None
    width: int | None = None
    height: int | None = None
    steps: int | None = None

    @property
    def loads_only(self) -> bool:
        return not self.prompt and not self.system and not self.images and not self.suffix

    @property
    def completes(self) -> bool:
        """Whether it is a legacy completion (no template): `raw`, or an insertion between `prompt` and `suffix`."""
        return self.raw or bool(self.suffix)


class OllamaEmbedRequest(_Named):
    """`POST /api/embed`."""

    input: str | list[str] = ""
    truncate: bool = True
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None
    dimensions: int | None = Field(default=None, ge=1)


class OllamaEmbeddingsRequest(_Named):
    """`POST /api/embeddings`, Ollama's older embedding route: one prompt, one vector."""

    prompt: str = ""
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None


class OllamaShowRequest(_Named):
    """`POST /api/show` (`name` is Ollama's older spelling of `model`)."""

    model: str = Field(default="", max_length=512)
    name_: str | None = Field(default=None, alias="name", max_length=512)
    verbose: bool | None = None

    @model_validator(mode="after")
    def _one_name(self) -> "OllamaShowRequest":
        if not self.model:
            if not self.name_:
                raise ValueError("`model` is required")
            self.model = self.name_
        return self


@dataclass(frozen=True)
class OllamaTagsRequest:
    """`GET /api/tags`: the models the key may use."""


@dataclass(frozen=True)
class OllamaPsRequest:
    """`GET /api/ps`: the models the key may use that are loaded now."""


@dataclass(frozen=True)
class OllamaVersionRequest:
    """`GET /api/version`."""


# ---- reading a body -----------------------------------------------------------------------------------------

_GENERATE_REFUSED = {
    "template": "`template` is not supported: the model's chat template is its GGUF's (send `raw: true` with a "
                "prompt you templated yourself)",
    "context": "`context` is not supported: send the conversation to /api/chat instead",
    "width": "image generation is not supported", "height": "image generation is not supported",
    "steps": "image generation is not supported",
}


def _refuse(param: str, why: str) -> Exception:
    return invalid_request(f"{why}.", param=param, code="unsupported_parameter")


def _check_generating(req: _Generating) -> None:
    if req.logprobs:
        raise _refuse("logprobs", "`logprobs` is not supported on Ollama's routes; /v1/chat/completions and "
                                  "/v1/completions return them")


def parse_chat(payload: Any) -> OllamaChatRequest:
    req = parse_request(OllamaChatRequest, payload)
    _check_generating(req)
    return req


def parse_generate(payload: Any) -> OllamaGenerateRequest:
    req = parse_request(OllamaGenerateRequest, payload)
    for field, why in _GENERATE_REFUSED.items():
        if getattr(req, field):  # an empty value asks for nothing
            raise _refuse(field, why)
    if req.raw and req.images:
        raise _refuse("images", "`images` need the model's template: send them without `raw`")
    if req.raw and req.system:
        raise _refuse("system", "`system` needs the model's template: with `raw`, write it into the prompt")
    if req.suffix and (req.images or req.system):
        field = "images" if req.images else "system"
        raise _refuse(field, f"`{field}` cannot go with `suffix`: an insertion's prompt is the model's "
                             "fill-in-the-middle layout of `prompt` and `suffix` alone")
    _check_generating(req)
    return req


def parse_embed(payload: Any) -> OllamaEmbedRequest:
    return parse_request(OllamaEmbedRequest, payload)


def parse_embeddings(payload: Any) -> OllamaEmbeddingsRequest:
    return parse_request(OllamaEmbeddingsRequest, payload)


def parse_show(payload: Any) -> OllamaShowRequest:
    return parse_request(OllamaShowRequest, payload)
