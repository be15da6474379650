"""The Responses API's request (`POST /v1/responses`, `POST /v1/responses/input_tokens`), validated as strictly
as the chat route's: no coercion, every problem a 400 naming its `param`. Unlike the chat route, an unknown
top-level field is a 400 too: this API grows fast, and a field that would change the answer must not be
dropped silently. Fields of OpenAI's that this server cannot honour are known here and refused with a reason
(built-in tools, `background`, `conversation`, ...); those that change nothing here (`service_tier`,
`prompt_cache_key`, `safety_identifier`) are accepted and ignored.

Input items are read leniently about the bookkeeping fields an SDK sends back with its own output items
(`id`, `status`, `annotations`, `logprobs`): they say nothing the prompt needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ..api.errors import invalid_request
from ..api.schemas import (
    SpeculativeControls,
    ToolName,
    _Unsupported,
    check_stop,
    parse_request,
    validation_error,
)


class _Item(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# ---- input items ---------------------------------------------------------------------------------

class InputText(_Item):
    type: Literal["input_text"]
    text: str


class OutputText(_Item):
    type: Literal["output_text"]
    text: str


class Refusal(_Item):
    type: Literal["refusal"]
    refusal: str


class InputImage(_Item):
    """An image (a model with a projector): by URL (a data URL, or http(s) where the server fetches them).
    `file_id` needs the Files API, which this server has not: refused in the mapping."""
    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["low", "high", "auto", "original"] | None = None


class NonTextPart(_Item):
    """A part this server cannot read: refused in the mapping with its position."""
    type: Literal["input_file", "input_audio"]


ContentPart = Annotated[Union[InputText, OutputText, Refusal, InputImage, NonTextPart], Field(discriminator="type")]


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]


class FunctionCallItem(_Item):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str
    arguments: str


class FunctionCallOutputItem(_Item):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[ContentPart]


class ReasoningText(_Item):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(_Item):
    """A reasoning item passed back: its text becomes the assistant turn's `reasoning_content`."""
    type: Literal["reasoning"]
    summary: list[ReasoningText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None

    @model_validator(mode="after")
    def _readable(self) -> ReasoningItem:
        if self.encrypted_content is not None:
            raise _Unsupported("input", "Encrypted reasoning (`encrypted_content`) is not supported: this server "
                                        "never encrypts reasoning, send its `content` back as it came.")
        return self

    @property
    def text(self) -> str:
        parts = self.content if self.content else self.summary
        return "".join(p.text for p in parts)


SUPPORTED_ITEMS = ("message", "function_call", "function_call_output", "reasoning")
InputItem = Annotated[Union[MessageItem, FunctionCallItem, FunctionCallOutputItem, ReasoningItem],
                      Field(discriminator="type")]


def _item_type(v: Any) -> Any:
    """An item without `type` is a message (OpenAI's EasyInputMessage)."""
    if isinstance(v, dict) and "type" not in v and "role" in v:
        return {**v, "type": "message"}
    return v


# ---- tools and formats -----------------------------------------------------------------------------

BUILT_IN_TOOLS = ("web_search", "web_search_preview", "file_search", "computer_use_preview", "computer",
                  "code_interpreter", "mcp", "image_generation", "local_shell", "shell", "apply_patch", "custom",
                  "tool_search")


class FunctionTool(_Item):
    """A function tool in the Responses API's flat shape."""
    type: Literal["function"]
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(_Strict):
    type: Literal["function"]
    name: str


# Echoed in every response and kept in the store, but never part of the prompt, so only these bound them
# (what reaches the prompt, `instructions` and `input`, is bounded by the model's context).
MAX_FORMAT_NAME_CHARS = 64          # OpenAI's, with its alphabet
MAX_FORMAT_DESCRIPTION_CHARS = 4096
MAX_USER_CHARS = 256                # OpenAI's `safety_identifier`, which replaces `user`, takes 64


class TextFormat(_Item):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, max_length=MAX_FORMAT_NAME_CHARS, pattern=r"^[A-Za-z0-9_-]+$")
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = Field(default=None, max_length=MAX_FORMAT_DESCRIPTION_CHARS)

    @model_validator(mode="after")
    def _schema(self) -> TextFormat:
        if self.type == "json_schema" and (self.schema_ is None or not self.name):
            raise ValueError("a `json_schema` format needs `name` and `schema`")
        return self


class TextParam(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None

    @model_validator(mode="after")
    def _verbosity(self) -> TextParam:
        if self.verbosity is not None:
            raise _Unsupported("text.verbosity", "`text.verbosity` is not supported: the models here have no "
                                                 "verbosity control.")
        return self


class ReasoningParam(_Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class StreamOptions(_Strict):
    include_obfuscation: bool | None = None  # nothing is obfuscated: accepted, changes nothing


# ---- the request -----------------------------------------------------------------------------------

MAX_METADATA_KEYS = 16          # OpenAI's
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512

# OpenAI's fields this server refuses when set, and why.
REFUSED = {
    "background": "`background` responses are not supported: the server answers while the request is open "
                  "(use `stream: true` for long replies).",
    "conversation": "`conversation` objects are not supported; continue a conversation with "
                    "`previous_response_id` or by sending the items back in `input`.",
    "prompt": "Prompt templates (`prompt`) are not supported: send `instructions` and `input`.",
    "context_management": "`context_management` is not supported.",
    "prompt_cache_options": "`prompt_cache_options` is not supported.",
}


class ResponsesRequest(_Strict, SpeculativeControls):
    model: str = Field(min_length=1)
    input: str | list[InputItem]
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = Field(default=None, ge=1)  # counts built-in tool calls only: none here
    text: TextParam | None = None
    reasoning: ReasoningParam | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    metadata: dict[str, str] | None = None
    user: str | None = Field(default=None, max_length=MAX_USER_CHARS)
    store: bool | None = True
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    safety_identifier: str | None = Field(default=None, max_length=64)
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    # Refused when set (REFUSED says why).
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    context_management: Any = None
    prompt_cache_options: Any = None
    # llamaray's extensions (not OpenAI's): as the chat route takes them (and SpeculativeControls).
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)
    stop: str | list[str] | None = None
    cache_salt: str | None = None
    cache_prompt: bool | None = None

    @property
    def include_usage(self) -> bool:
        return False  # a response's usage is in its final event, always

    @field_validator("input", mode="before")
    @classmethod
    def _items(cls, v: Any) -> Any:
        if isinstance(v, list):
            if not v:
                raise ValueError("`input` needs at least one item")
            for i, item in enumerate(v):
                kind = item.get("type") if isinstance(item, dict) else None
                if kind is not None and kind not in SUPPORTED_ITEMS:
                    raise _Unsupported(f"input[{i}].type", f"Input items of type `{kind}` are not supported "
                                                           f"(supported: {', '.join(SUPPORTED_ITEMS)}).")
            return [_item_type(item) for item in v]
        return v

    @field_validator("tools", mode="before")
    @classmethod
    def _tools(cls, v: Any) -> Any:
        for i, tool in enumerate(v if isinstance(v, list) else []):
            kind = tool.get("type") if isinstance(tool, dict) else "function"
            if kind != "function":
                why = "built-in tools are not supported here, only `function` tools" if kind in BUILT_IN_TOOLS \
                    or (isinstance(kind, str) and kind.startswith(("web_search", "computer"))) \
                    else "only `function` tools are supported"
                raise _Unsupported(f"tools[{i}].type", f"Tool type {kind!r} is not supported: {why}.")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        return check_stop(v)

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is None:
            return v
        if len(v) > MAX_METADATA_KEYS:
            raise ValueError(f"at most {MAX_METADATA_KEYS} metadata keys are allowed")
        for key, value in v.items():
            if len(key) > MAX_METADATA_KEY_CHARS or len(value) > MAX_METADATA_VALUE_CHARS:
                raise ValueError(f"metadata keys have at most {MAX_METADATA_KEY_CHARS} characters and values "
                                 f"at most {MAX_METADATA_VALUE_CHARS}")
        return v

    @model_validator(mode="after")
    def _supported(self) -> ResponsesRequest:
        for name, why in REFUSED.items():
            value = getattr(self, name)
            if value is not None and value is not False:
                raise _Unsupported(name, why)
        if self.truncation == "auto":
            raise _Unsupported("truncation", "`truncation: auto` is not supported: a conversation past the "
                                             "model's context is a 400 (`disabled`, the default).")
        if self.include:
            raise _Unsupported("include", f"`include` entries are not supported (got {self.include[0]!r}): "
                                          f"nothing this server returns is left out by default.")
        if self.top_logprobs:
            raise _Unsupported("top_logprobs", "`top_logprobs` is not supported on this route; use "
                                               "/v1/chat/completions for log probabilities.")
        if isinstance(self.tool_choice, dict):
            kind = self.tool_choice.get("type")
            raise _Unsupported("tool_choice", f"`tool_choice` of type {kind!r} is not supported (supported: "
                                              f"\"none\", \"auto\", \"required\", {{\"type\": \"function\", "
                                              f"\"name\": ...}}).")
        if self.stream_options is not None and not self.stream:
            raise _Unsupported("stream_options", "`stream_options` is only allowed when `stream` is true.")
        return self


class InputTokensRequest(ResponsesRequest):
    """`POST /v1/responses/input_tokens`: the fields that shape the prompt, counted, never generated."""

    stream: Literal[False] | None = False


def parse_responses_request(payload: Any, model: type[ResponsesRequest] = ResponsesRequest) -> ResponsesRequest:
    """The request, or a 400 naming the field: an unknown one first, as OpenAI answers it."""
    if not isinstance(payload, dict):
        return parse_request(model, payload)  # its 400 for a body that is not an object
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        unknown = [e["loc"][0] for e in exc.errors(include_url=False)
                   if e["type"] == "extra_forbidden" and len(e["loc"]) == 1]
        if unknown:
            raise invalid_request(f"Unrecognized request argument supplied: {unknown[0]}", param=str(unknown[0]),
                                  code="unknown_parameter") from None
        raise validation_error(exc) from None


def parse_input_tokens_request(payload: Any) -> InputTokensRequest:
    return parse_responses_request(payload, InputTokensRequest)


@dataclass(frozen=True)
class StoredResponseRequest:
    """`GET /v1/responses/{response_id}`: the caller's stored response, read back (no model: the store answers)."""

    response_id: str


@dataclass(frozen=True)
class DeleteResponseRequest:
    """`DELETE /v1/responses/{response_id}`: the caller's stored response, forgotten."""

    response_id: str
