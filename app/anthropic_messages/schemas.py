"""Anthropic's Messages API requests as data: `POST /v1/messages` and `POST /v1/messages/count_tokens`.

Strict as Anthropic's own API is: an unknown field is a 400 naming it, a value of the wrong JSON type is
never coerced. What the API has but this server cannot do (images, documents, server tools, MCP servers,
containers) is a 400 naming the field and why, found before the models are validated so the message says
"not supported" rather than "invalid".
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..api.errors import APIError, invalid_request
from ..api.schemas import SpeculativeControls, ToolName, check_stop


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class CacheControl(_Strict):
    """Accepted and ignored: every prompt's prefix is cached here without being asked (docs/api.md)."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


# ---- content blocks ------------------------------------------------------------------------------

class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: None = None  # citations need documents, which are refused


class Base64ImageSource(_Strict):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class URLImageSource(_Strict):
    type: Literal["url"]
    url: str


class ImageBlock(_Strict):
    """An image (a model with a projector), as a data URL to chat's image_url part. A `file` source needs
    the Files API, which this server has not: refused by validation."""
    type: Literal["image"]
    source: Annotated[Union[Base64ImageSource, URLImageSource], Field(discriminator="type")]
    cache_control: CacheControl | None = None

    def url(self) -> str:
        source = self.source
        return source.url if isinstance(source, URLImageSource) else f"data:{source.media_type};base64,{source.data}"


class DirectCaller(_Strict):
    """Who made a call: the model itself (server-side code execution, the other caller, is refused)."""

    type: Literal["direct"]


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: str = Field(pattern=r"^[a-zA-Z0-9_-]+$")
    name: str = Field(min_length=1)
    input: dict[str, Any]
    cache_control: CacheControl | None = None
    caller: DirectCaller | None = None  # as a reply's tool_use block has it, passed back
    toolset_name: None = None  # the SDK's dump of a reply's block has it null; a server toolset's call is refused


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str = Field(pattern=r"^[a-zA-Z0-9_-]+$")
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None


class ThinkingBlock(_Strict):
    """An earlier reply's thinking, passed back: it becomes that assistant turn's `reasoning_content`."""

    type: Literal["thinking"]
    thinking: str
    signature: str


class RedactedThinkingBlock(_Strict):
    """Claude's encrypted thinking: nothing a local model can read, dropped (this server never makes one)."""

    type: Literal["redacted_thinking"]
    data: str


ContentBlock = Annotated[Union[TextBlock, ImageBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock, RedactedThinkingBlock],
                         Field(discriminator="type")]


class InputMessage(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


# ---- tools ---------------------------------------------------------------------------------------

class InputSchema(BaseModel):
    """A JSON Schema of type object; its other keywords are the schema's own, kept as they are."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["object"]


class Tool(_Strict):
    type: Literal["custom"] | None = None
    name: ToolName
    description: str | None = None
    input_schema: InputSchema
    cache_control: CacheControl | None = None
    strict: bool | None = None
    eager_input_streaming: bool | None = None  # input always streams as it is generated


class ToolChoiceAuto(_Strict):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(_Strict):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(_Strict):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(_Strict):
    type: Literal["none"]


ToolChoice = Annotated[Union[ToolChoiceAuto, ToolChoiceAny, ToolChoiceTool, ToolChoiceNone],
                       Field(discriminator="type")]


# ---- thinking, output, metadata ------------------------------------------------------------------

class ThinkingEnabled(_Strict):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1024)
    display: Literal["summarized", "omitted"] | None = None


class ThinkingDisabled(_Strict):
    type: Literal["disabled"]


class ThinkingAdaptive(_Strict):
    type: Literal["adaptive"]
    display: Literal["summarized", "omitted"] | None = None


ThinkingConfig = Annotated[Union[ThinkingEnabled, ThinkingDisabled, ThinkingAdaptive], Field(discriminator="type")]


class JsonOutputFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Strict):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None  # a hint with no knob here: ignored
    format: JsonOutputFormat | None = None


class Metadata(_Strict):
    user_id: str | None = Field(default=None, max_length=512)


# ---- the requests --------------------------------------------------------------------------------

class _Conversation(_Strict):
    """What renders the prompt: shared by a generation and its token count."""

    model: str = Field(min_length=1)
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    cache_control: CacheControl | None = None


class MessagesRequest(_Conversation, SpeculativeControls):
    """`POST /v1/messages`."""

    max_tokens: int = Field(ge=1)
    stream: bool | None = False
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None  # one tier here: either is served the same
    inference_geo: str | None = None  # where the model runs is this server: ignored
    # llamaray's extensions, as on the chat route (llama-server's fields): reuse no cached prompt prefix; and
    # the speculative decoding controls (SpeculativeControls)
    cache_prompt: bool | None = None

    # what the lifecycle asks of every generating request
    @property
    def cache_salt(self) -> None:
        return None

    @property
    def include_usage(self) -> bool:
        return False  # a stream's usage is in its message_delta event, always

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        check_stop(v)
        return v


class CountTokensRequest(_Conversation):
    """`POST /v1/messages/count_tokens`: the prompt a Messages request would render, counted."""


# ---- refused before validation -------------------------------------------------------------------

TEXT_ONLY = "this server's models take text (and images, with a projector) only"
REFUSED_BLOCKS = {
    "document": TEXT_ONLY, "search_result": TEXT_ONLY,
    "server_tool_use": "server tools are not supported", "web_search_tool_result": "server tools are not supported",
    "web_fetch_tool_result": "server tools are not supported",
    "code_execution_tool_result": "server tools are not supported",
    "bash_code_execution_tool_result": "server tools are not supported",
    "text_editor_code_execution_tool_result": "server tools are not supported",
    "tool_search_tool_result": "server tools are not supported", "tool_reference": "server tools are not supported",
    "mcp_tool_use": "MCP servers are not supported", "mcp_tool_result": "MCP servers are not supported",
    "container_upload": "containers are not supported",
}
REFUSED_FIELDS = {
    "container": "containers (code execution) are not supported",
    "mcp_servers": "MCP servers are not supported: define the tools in `tools` and run them client-side",
    "context_management": "server-side context management is not supported",
}


class _Refused(Exception):
    def __init__(self, param: str, why: str) -> None:
        super().__init__(f"{param}: {why}.")
        self.param = param


def refuse_unsupported(payload: dict[str, Any]) -> None:
    """The first thing in a request body this server cannot do, as a 400 naming its field."""
    for name, why in REFUSED_FIELDS.items():
        if payload.get(name) is not None:
            raise _Refused(name, why)
    for i, tool in enumerate(_items(payload.get("tools"))):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in (None, "custom"):
            raise _Refused(f"tools.{i}.type", f"server tool `{kind}` is not supported; only custom tools (with "
                                              f"`input_schema`) are, run by the client")
    for i, block in enumerate(_items(payload.get("system"))):
        _refuse_block(block, f"system.{i}")
    for i, message in enumerate(_items(payload.get("messages"))):
        if not isinstance(message, dict):
            continue
        for j, block in enumerate(_items(message.get("content"))):
            where = f"messages.{i}.content.{j}"
            _refuse_block(block, where)
            if isinstance(block, dict) and block.get("type") == "tool_result":
                for k, part in enumerate(_items(block.get("content"))):
                    _refuse_block(part, f"{where}.content.{k}")


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _refuse_block(block: Any, where: str) -> None:
    kind = block.get("type") if isinstance(block, dict) else None
    if isinstance(kind, str) and kind in REFUSED_BLOCKS:
        raise _Refused(f"{where}.type", f"`{kind}` blocks are not supported: {REFUSED_BLOCKS[kind]}")
    if isinstance(block, dict) and block.get("citations"):
        raise _Refused(f"{where}.citations", "citations are not supported (they need documents)")


# ---- validation --------------------------------------------------------------------------------

def parse_messages_request(payload: Any) -> MessagesRequest:
    return _parse(MessagesRequest, payload)


def parse_count_tokens_request(payload: Any) -> CountTokensRequest:
    return _parse(CountTokensRequest, payload)


def _parse(model: type[_Conversation], payload: Any) -> Any:
    if not isinstance(payload, dict):
        raise invalid_request("The request body must be a JSON object.")
    try:
        refuse_unsupported(payload)
        return model.model_validate(payload)
    except _Refused as exc:
        raise invalid_request(str(exc), param=exc.param, code="unsupported_parameter") from None
    except ValidationError as exc:
        raise validation_error(exc) from None


_BLOCK_TAGS = {"text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking", "auto", "any", "tool",
               "none", "enabled", "disabled", "adaptive", "base64", "url"}
_UNION_FIELDS = {"tool_choice", "thinking", "source"}
_TYPE_LABEL = re.compile(r"^(str|int|float|bool|none|[a-z]+\[.*\]|function-(after|before|plain)\[.*)$")


def field_path(loc: tuple[Any, ...]) -> str:
    """pydantic's location as Anthropic names fields (`messages.0.content.1.text`), without union labels:
    a discriminator tag right after a list index or a union field, or a union member's type label."""
    parts: list[str] = []
    prev: Any = None
    for part in loc:
        tag = isinstance(part, str) and part in _BLOCK_TAGS and (isinstance(prev, int) or prev in _UNION_FIELDS)
        if not tag and not (isinstance(part, str) and _TYPE_LABEL.match(part)):
            parts.append(str(part))
        prev = part
    return ".".join(parts)


def validation_error(exc: ValidationError) -> APIError:
    errors = exc.errors(include_url=False)
    # A union that fails on every branch reports each; the deepest error about the same field says most.
    head = errors[0]["loc"][:2]
    first = max((e for e in errors if e["loc"][:2] == head), key=lambda e: len(e["loc"]))
    path = field_path(tuple(first.get("loc", ())))
    kind, ctx = first.get("type"), first.get("ctx") or {}
    if kind == "missing":
        detail = "Field required"
    elif kind == "extra_forbidden":
        detail = "Extra inputs are not permitted (this field is unknown or not supported)"
    elif kind == "union_tag_invalid":
        detail = f"Input tag {ctx.get('tag')!r} found using 'type' does not match any of the expected tags: " \
                 f"{ctx.get('expected_tags')}"
    else:
        detail = str(first.get("msg", "Invalid value")).removeprefix("Value error, ")
    return invalid_request(f"{path}: {detail}" if path else detail, param=path or None,
                           code="missing_required_parameter" if kind == "missing" else "invalid_value")
