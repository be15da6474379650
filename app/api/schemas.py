"""Request models with OpenAI's field names and ranges, and helpers for error messages.

Unknown top-level fields are accepted and ignored (SDKs and frameworks send extras); fields we
know but cannot honour (e.g. `functions`) are rejected with a 400 that says so. Types are
strict, as OpenAI's API has them: `"stream": "yes"` or `"max_tokens": "10"` is a 400 naming the
field, never a silent coercion (an integer is still a valid number).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import (AfterValidator, AliasChoices, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo,
                      field_validator, model_validator)

from ..config.schema import MAX_ADAPTER_SCALE
from .errors import APIError, invalid_request


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


_M = TypeVar("_M", bound=BaseModel)


# ---- message content ---------------------------------------------------------------------------

class TextPart(_Model):
    type: Literal["text"]
    text: str


class ImagePart(_Model):
    type: Literal["image_url"]
    image_url: Any = None


class AudioPart(_Model):
    type: Literal["input_audio"]
    input_audio: Any = None


class FilePart(_Model):
    type: Literal["file"]
    file: Any = None


class RefusalPart(_Model):
    type: Literal["refusal"]
    refusal: str


ContentPart = Annotated[Union[TextPart, ImagePart, AudioPart, FilePart, RefusalPart], Field(discriminator="type")]
Content = Union[str, list[ContentPart]]


class FunctionCall(_Model):
    name: str
    arguments: str


class MessageToolCall(_Model):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(_Model):
    role: Literal["system", "developer"]
    content: Content
    name: str | None = None


class UserMessage(_Model):
    role: Literal["user"]
    content: Content
    name: str | None = None


class AssistantMessage(_Model):
    role: Literal["assistant"]
    content: Content | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    reasoning_content: str | None = None

    @model_validator(mode="after")
    def _content_or_calls(self) -> "AssistantMessage":
        if self.content is None and not self.tool_calls:
            raise ValueError("an assistant message needs `content` or `tool_calls`")
        return self


class ToolMessage(_Model):
    role: Literal["tool"]
    content: Content
    tool_call_id: str


Message = Annotated[Union[SystemMessage, UserMessage, AssistantMessage, ToolMessage], Field(discriminator="role")]


# ---- tools -------------------------------------------------------------------------------------

TOOL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _tool_name(v: str) -> str:
    if not TOOL_NAME_RE.match(v):
        raise ValueError("function name must match ^[a-zA-Z0-9_-]{1,64}$")
    return v


ToolName = Annotated[str, AfterValidator(_tool_name)]
"""A tool's name as every protocol's tools take it (the grammars and parsers key calls by it)."""


class FunctionDef(_Model):
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Model):
    type: Literal["function"]
    function: FunctionDef


class NamedToolChoice(_Model):
    type: Literal["function"]
    function: dict[str, str]


class StreamOptions(_Model):
    include_usage: bool | None = None


class JSONSchemaFormat(_Model):
    name: str = "response"
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(_Model):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


MAX_LORA_ENTRIES = 16


class LoraEntry(_Model):
    """One entry of llama-server's per-request `lora` list: an adapter of the model by its index in the model's
    `adapters` (`id`, llama-server's form) or by its name, and the scale to apply it at (default: the
    adapter's configured scale)."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    id: int | None = Field(default=None, ge=0)
    name: str | None = Field(default=None, min_length=1)
    scale: float | None = Field(default=None, ge=-MAX_ADAPTER_SCALE, le=MAX_ADAPTER_SCALE)

    @model_validator(mode="after")
    def _named(self) -> "LoraEntry":
        if self.id is None and self.name is None:
            raise ValueError("a `lora` entry names its adapter by `id` (its index in the model's adapters) or "
                             "`name`")
        return self


MAX_DRAFT_TOKENS = 64  # a request's `speculative.n_max` / `n_min` (SpeculativeConfig's bounds)


class SpeculativeControls(BaseModel):
    """A request's speculative decoding controls: `speculative` (false: off for this request) and llama-server's
    `speculative.n_max` / `speculative.n_min`, dotted keys of the body as llama-server reads them. The chat and
    legacy completions requests have them, and Responses and Messages, which pass them on (`as_chat_fields`)."""

    speculative: bool | None = None
    speculative_n_max: int | None = Field(default=None, alias="speculative.n_max", ge=0, le=MAX_DRAFT_TOKENS)
    speculative_n_min: int | None = Field(default=None, alias="speculative.n_min", ge=0, le=MAX_DRAFT_TOKENS)

    @field_validator("speculative_n_min")
    @classmethod
    def _draft_range(cls, v: int | None, info: ValidationInfo) -> int | None:
        n_max = info.data.get("speculative_n_max")  # validated first (declared first)
        if v is not None and n_max is not None and v > n_max:
            raise ValueError(f"must not exceed `speculative.n_max` ({n_max})")
        return v

    def speculative_chat_fields(self) -> dict[str, Any]:
        """The controls set, under the chat request's keys."""
        fields = {"speculative": self.speculative, "speculative.n_max": self.speculative_n_max,
                  "speculative.n_min": self.speculative_n_min}
        return {k: v for k, v in fields.items() if v is not None}


class _SamplingChecks(_Model, SpeculativeControls):
    """`stop` and `logit_bias` checks shared by the chat and the legacy completions request, and their
    speculative decoding controls."""

    @field_validator("stop", check_fields=False)
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        return check_stop(v)

    @field_validator("logit_bias", check_fields=False)
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        return check_logit_bias(v)

    @field_validator("cache_salt", check_fields=False)
    @classmethod
    def _cache_salt(cls, v: str | None) -> str | None:
        return check_cache_salt(v)


# ---- the request -------------------------------------------------------------------------------

MAX_STOP_SEQUENCES = 4       # OpenAI's
MAX_STOP_CHARS = 512         # each; the stream holds back as much text as the longest stop sequence
MAX_LOGIT_BIAS = 300         # OpenAI's: entries in one `logit_bias`
MAX_CACHE_SALT_CHARS = 256


def check_stop(v: str | list[str] | None) -> str | list[str] | None:
    stops = [v] if isinstance(v, str) else v or []
    if len(stops) > MAX_STOP_SEQUENCES:
        raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed")
    if any(s == "" for s in stops) and isinstance(v, list):
        raise ValueError("stop sequences must not be empty")
    longest = max((len(s) for s in stops), default=0)
    if longest > MAX_STOP_CHARS:
        raise ValueError(f"each stop sequence may have at most {MAX_STOP_CHARS} characters; one has {longest}")
    return v


def check_logit_bias(v: dict[str, float] | None) -> dict[str, float] | None:
    if v is not None and len(v) > MAX_LOGIT_BIAS:
        raise ValueError(f"at most {MAX_LOGIT_BIAS} tokens may be biased; got {len(v)}")
    seen: dict[int, str] = {}
    for key, bias in (v or {}).items():
        if not key.isascii() or not key.isdigit() or len(key) > 9:
            raise ValueError(f"keys must be token ids (integers as strings); got {key!r}")
        if not -100 <= bias <= 100:
            raise ValueError(f"bias values must be between -100 and 100; got {bias} for token {key}")
        if int(key) in seen:  # "1" and "01" name one token: two biases would add up past the range
            raise ValueError(f"token {int(key)} is biased twice ({seen[int(key)]!r} and {key!r})")
        seen[int(key)] = key
    return v


def check_cache_salt(v: str | None) -> str | None:
    if v is not None and not 1 <= len(v) <= MAX_CACHE_SALT_CHARS:
        raise ValueError(f"`cache_salt` must have 1 to {MAX_CACHE_SALT_CHARS} characters")
    return v


# The chat template switches a request may set (`chat_template_kwargs`), with their types: Qwen3's, GLM's and
# others' `enable_thinking`. Passed only to templates that read them (app/generation/reasoning.py).
TEMPLATE_SWITCHES: dict[str, type] = {"enable_thinking": bool}


def stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


class ChatCompletionRequest(_SamplingChecks):
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    n: int | None = Field(default=None, ge=1, le=128)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    user: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logit_bias: dict[str, float] | None = None
    # Deprecated by OpenAI in favour of tools / tool_choice; refused with a pointer rather than ignored.
    functions: list[Any] | None = None
    function_call: Any = None
    # llama.cpp-style extras, as llama-server accepts them
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repeat_penalty: float | None = Field(default=None, gt=0, le=10)
    grammar: str | None = None
    include_reasoning: bool | None = True
    # OpenAI's; handed to the chat template as `reasoning_effort` (templates that take it: gpt-oss, ...), and the
    # reasoning budget its model's entry gives that effort (app/generation/reasoning.py).
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    # llama-server's: the most tokens the reply may reason for (-1: unbounded; 0: no reasoning).
    thinking_budget_tokens: int | None = Field(default=None, ge=-1)
    # llama-server's (vLLM's too) switches for the chat template: only those this server knows (TEMPLATE_SWITCHES),
    # passed where the template reads them; never free-form variables.
    chat_template_kwargs: dict[str, Any] | None = None
    # Prompt-cache controls, as vLLM (`cache_salt`) and llama-server (`cache_prompt`) take them.
    cache_salt: str | None = None
    cache_prompt: bool | None = None
    # llama-server's per-request LoRA adapters (app/generation/adapters.py reads it against the model).
    lora: list[LoraEntry] | None = Field(default=None, max_length=MAX_LORA_ENTRIES)

    @model_validator(mode="after")
    def _supported(self) -> "ChatCompletionRequest":
        if self.top_logprobs is not None and not self.logprobs:
            raise _Unsupported("top_logprobs", "`top_logprobs` requires `logprobs` to be true.")
        for legacy, modern in (("functions", "tools"), ("function_call", "tool_choice")):
            if getattr(self, legacy) is not None:
                raise _Unsupported(legacy, f"`{legacy}` is deprecated and not supported; use `{modern}` "
                                           f"(same function definitions, wrapped as {{\"type\": \"function\", "
                                           f"\"function\": ...}}).")
        return self

    @field_validator("chat_template_kwargs")
    @classmethod
    def _switches(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        for key, value in (v or {}).items():
            kind = TEMPLATE_SWITCHES.get(key)
            if kind is None:
                raise _Unsupported(f"chat_template_kwargs.{key[:64]}",
                                   f"`chat_template_kwargs.{key[:64]}` is not passed to chat templates: this server "
                                   f"sets only its known switches ({', '.join(TEMPLATE_SWITCHES)}), never free-form "
                                   f"template variables.")
            if not isinstance(value, kind):
                raise _Unsupported(f"chat_template_kwargs.{key}", f"`chat_template_kwargs.{key}` must be a "
                                                                   f"{kind.__name__}.")
        return v

    @property
    def stop_list(self) -> list[str]:
        return stop_list(self.stop)

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def choices(self) -> int:
        return self.n or 1

    @property
    def logprobs_k(self) -> int | None:
        """The engine's logprobs setting: None (none), else how many alternatives per token."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class _Unsupported(ValueError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


_UNION_TAGS = {"system", "developer", "user", "assistant", "tool", "text", "image_url", "input_audio", "file",
               "refusal"}
_TYPE_LABEL = re.compile(r"^(str|int|float|bool|none|NamedToolChoice|[a-z]+\[.*\]|function-(after|before|plain)\[.*)$")


def _param_path(loc: tuple[Any, ...]) -> str | None:
    """pydantic location -> OpenAI-style param (`messages[0].role`), skipping union labels:
    a discriminator tag right after a list index, or a union member's type label."""
    out = ""
    prev: Any = None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif (isinstance(prev, int) and part in _UNION_TAGS) or _TYPE_LABEL.match(str(part)):
            pass
        else:
            out += ("." if out else "") + str(part)
        prev = part
    return out or None


def _describe(err: dict[str, Any]) -> str:
    kind = err.get("type")
    ctx = err.get("ctx") or {}
    if kind == "union_tag_invalid":
        tag = ctx.get("tag")
        expected = ctx.get("expected_tags")
        return f"Invalid value {tag!r}: expected one of {expected}."
    if kind == "union_tag_not_found":
        return f"Missing required discriminator field {ctx.get('discriminator')}."
    if kind == "missing":
        return "Missing required parameter."
    if kind == "value_error" and isinstance(ctx.get("error"), _Unsupported):
        return str(ctx["error"])
    msg = err.get("msg", "Invalid value.")
    return msg.removeprefix("Value error, ")


def parse_request(model: type[_M], payload: Any) -> _M:
    """Validate a decoded JSON body as `model`; the first problem becomes a 400 naming its `param`."""
    if not isinstance(payload, dict):
        raise invalid_request("The request body must be a JSON object.")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise validation_error(exc) from None


def parse_chat_request(payload: Any) -> ChatCompletionRequest:
    return parse_request(ChatCompletionRequest, payload)


def validation_error(exc: ValidationError) -> APIError:
    errors = exc.errors(include_url=False)
    # A union that fails on every branch reports each; the deepest error about the same field
    # says most (a text part without `text`, rather than "content is not a string").
    head = errors[0]["loc"][:2]
    first = max((e for e in errors if e["loc"][:2] == head), key=lambda e: len(e["loc"]))
    ctx = first.get("ctx") or {}
    if isinstance(ctx.get("error"), _Unsupported):
        return invalid_request(str(ctx["error"]), param=ctx["error"].param, code="unsupported_parameter")
    param = _param_path(tuple(first.get("loc", ())))
    if first.get("type") == "union_tag_invalid" and param:
        param += "." + str(ctx.get("discriminator", "")).strip("'")
    detail = _describe(first)
    message = f"Invalid parameter `{param}`: {detail}" if param else detail
    more = len(errors) - 1
    if more:
        message += f" (and {more} more error{'s' if more > 1 else ''})"
    code = "missing_required_parameter" if first.get("type") == "missing" else "invalid_value"
    return invalid_request(message, param=param, code=code)


# ---- legacy text completions and the tokenizer routes -----------------------------------------

MAX_CHOICES = 128
"""Most choices one legacy request may ask for: prompts × n."""


class CompletionRequest(_SamplingChecks):
    """`POST /v1/completions` (OpenAI's legacy route): the prompt is the model's input as it is, no template."""

    model: str = Field(min_length=1)
    prompt: str | list[str]
    suffix: str | None = None
    max_tokens: int | None = Field(default=16, ge=0)  # OpenAI's default; 0 scores the prompt only (echo)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES)
    best_of: int | None = Field(default=None, ge=1, le=MAX_CHOICES)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)  # OpenAI allows 5; vLLM 20
    echo: bool | None = False
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # llama.cpp-style extras, as the chat route takes them
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repeat_penalty: float | None = Field(default=None, gt=0, le=10)
    grammar: str | None = None
    cache_salt: str | None = None
    cache_prompt: bool | None = None
    lora: list[LoraEntry] | None = Field(default=None, max_length=MAX_LORA_ENTRIES)

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        if isinstance(v, list):
            if not v:
                raise ValueError("at least one prompt is required")
            if any(isinstance(p, (int, list)) and not isinstance(p, bool) for p in v):
                raise _Unsupported("prompt", "Token-id prompts are not supported: send the prompt as text "
                                             "(a string or a list of strings; POST /detokenize turns ids into text).")
        return v

    @model_validator(mode="after")
    def _supported(self) -> CompletionRequest:
        if self.suffix and self.echo:
            raise _Unsupported("echo", "`echo` is not supported with `suffix`: an insertion's prompt is laid out "
                                       "around the completion, not before it.")
        n = self.n or 1
        if self.best_of is not None and self.best_of < n:
            raise ValueError("`best_of` must be greater than or equal to `n`")
        if self.best_of is not None and self.best_of != n:
            raise _Unsupported("best_of", "`best_of` larger than `n` is not supported (the server does not rank "
                                          "candidates); leave it out or set it equal to `n`.")
        if len(self.prompts) * n > MAX_CHOICES:
            raise _Unsupported("prompt", f"Too many choices: {len(self.prompts)} prompts × n={n} "
                                         f"(at most {MAX_CHOICES} in one request).")
        return self

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    @property
    def stop_list(self) -> list[str]:
        return stop_list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class InfillChunk(_Model):
    """One file of a fill-in-the-middle request's `input_extra` (/infill, /tokenize): its text, and its name
    (written before it in the prompt; llama-server's default when left out)."""

    text: str
    filename: str = "tmp"


class TokenizeRequest(_Model):
    """`POST /tokenize` (vLLM's shape): a prompt as it is, or messages rendered by the model's chat template
    exactly as the chat route renders them, or a fill-in-the-middle prompt laid out as /infill lays it out
    (`input_prefix`, `input_suffix`, `input_extra`, and `prompt` as what the completion starts with)."""

    model: str = Field(min_length=1)
    prompt: str | None = None
    input_prefix: str | None = None
    input_suffix: str | None = None
    input_extra: list[InfillChunk] | None = None
    messages: list[Message] | None = Field(default=None, min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    add_generation_prompt: bool = True
    # vLLM's name; llama-server's `add_special` is taken too. True: the special tokens the model's
    # tokenizer adds itself (BOS for most models), as a generation counts them.
    add_special: bool = Field(default=True, validation_alias=AliasChoices("add_special_tokens", "add_special"))

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if self.infill:
            if self.input_prefix is None or self.input_suffix is None:
                raise ValueError("a fill-in-the-middle prompt takes both `input_prefix` and `input_suffix`")
            if self.messages is not None:
                raise ValueError("give `messages` or a fill-in-the-middle prompt (`input_prefix`, `input_suffix`)")
            return self
        if self.input_extra is not None:
            raise ValueError("`input_extra` goes with `input_prefix` and `input_suffix`")
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either `prompt` or `messages`")
        if self.prompt is not None and (self.tools is not None or self.tool_choice is not None):
            raise ValueError("`tools` and `tool_choice` go with `messages`, not `prompt`")
        return self

    @property
    def infill(self) -> bool:
        """A fill-in-the-middle prompt's tokens are asked for."""
        return self.input_prefix is not None or self.input_suffix is not None

    def chat_request(self) -> ChatCompletionRequest:
        """The chat request whose prompt this is (already validated: only the fields that shape the prompt)."""
        return ChatCompletionRequest.model_construct(model=self.model, messages=self.messages, tools=self.tools,
                                                     tool_choice=self.tool_choice)


class DetokenizeRequest(_Model):
    model: str = Field(min_length=1)
    tokens: list[int]
