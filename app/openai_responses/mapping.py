"""A Responses request as the chat completions request it means: its input items as chat messages after the
stored conversation it continues, its tools, formats and limits under the chat route's names. Everything
downstream (planning, templates, grammars, parsers, limits) is the chat route's.

Items map to messages the same way whether they come from a client's `input` or from a response's own
`output` (a stored turn), so a conversation replayed either way renders the same prompt: its prefix stays
in the model's cache and on the replica that holds it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ..api.errors import invalid_request
from ..api.schemas import ChatCompletionRequest, validation_error
from .schemas import (
    ContentPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputImage,
    InputItem,
    MessageItem,
    NonTextPart,
    ReasoningItem,
    Refusal,
    ResponsesRequest,
)

_ITEMS = TypeAdapter(list[InputItem])


@dataclass(frozen=True)
class Turn:
    """One request's conversation: what it continues (`history`, chat messages without instructions, which
    a follow-up does not inherit), this turn's input as messages, and the chat request of both."""

    request: ResponsesRequest
    history: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    chat: ChatCompletionRequest

    def conversation(self, output: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The conversation after this turn's reply (`output`: the response's items): what a follow-up
        continues."""
        return [*self.history, *self.messages, *output_messages(output)]


def to_turn(req: ResponsesRequest, history: list[dict[str, Any]] | None = None) -> Turn:
    history = list(history or [])
    items = [MessageItem(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    messages = input_messages(items, "input")
    return Turn(req, history, messages, chat_request(req, history + messages))


def output_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as chat messages, read as input items are."""
    try:
        items = _ITEMS.validate_python([_as_input(item) for item in output], strict=False)
    except ValidationError as exc:
        raise validation_error(exc) from None
    return input_messages(items, "output")


def _as_input(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in ("id", "status")}


def input_messages(items: list[Any], where: str) -> list[dict[str, Any]]:
    """Chat messages of `items`: an assistant turn's reasoning, text and calls (consecutive items) in one
    assistant message, as the chat route takes them back."""
    out: list[dict[str, Any]] = []

    def assistant() -> dict[str, Any]:
        """The open assistant message (the last one, before any tool result or other role), or a new one."""
        if not out or out[-1]["role"] != "assistant":
            out.append({"role": "assistant", "content": None})
        return out[-1]

    for i, item in enumerate(items):
        param = f"{where}[{i}]"
        if isinstance(item, MessageItem):
            content = _content(item.content, f"{param}.content")
            last = out[-1] if out else None
            if (item.role == "assistant" and last is not None and last["role"] == "assistant"
                    and last["content"] is None and not last.get("tool_calls")):
                last["content"] = content  # the text after its reasoning
            else:
                out.append({"role": item.role, "content": content})
        elif isinstance(item, ReasoningItem):
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and last["content"] is None \
                    and not last.get("tool_calls") and "reasoning_content" not in last:
                last["reasoning_content"] = item.text
            else:
                out.append({"role": "assistant", "content": None, "reasoning_content": item.text})
        elif isinstance(item, FunctionCallItem):
            message = assistant()
            message.setdefault("tool_calls", []).append(
                {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}})
        elif isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id,
                        "content": _text(item.output, f"{param}.output")})
    for message in out:
        if message["role"] == "assistant" and message["content"] is None and not message.get("tool_calls"):
            message["content"] = ""  # reasoning alone
    return out


def _content(content: str | list[Any], param: str) -> str | list[dict[str, Any]]:
    """One text part as a plain string (as a reply is stored), several as chat parts (images as chat's
    image_url parts)."""
    if isinstance(content, str):
        return content
    parts = []
    for j, part in enumerate(content):
        if isinstance(part, NonTextPart):
            raise invalid_request(f"`{part.type}` content is not supported (text, and images for a model with a "
                                  f"projector).", param=f"{param}[{j}].type", code="unsupported_content")
        if isinstance(part, InputImage):
            parts.append(_image(part, f"{param}[{j}]"))
        elif isinstance(part, Refusal):
            parts.append({"type": "refusal", "refusal": part.refusal})
        else:
            parts.append({"type": "text", "text": part.text})
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


def _image(part: InputImage, param: str) -> dict[str, Any]:
    if not part.image_url:
        raise invalid_request("An `input_image` needs `image_url` (a data URL): `file_id` needs the Files API, "
                              "which this server has not.", param=f"{param}.image_url", code="unsupported_content")
    url: dict[str, Any] = {"url": part.image_url}
    if part.detail is not None:
        url["detail"] = part.detail
    return {"type": "image_url", "image_url": url}


def _text(content: str | list[ContentPart], param: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, (NonTextPart, Refusal, InputImage)):
            raise invalid_request(f"A function call's output takes text only; `{part.type}` is not supported.",
                                  param=f"{param}[{j}].type", code="unsupported_content")
        texts.append(part.text)
    return "".join(texts)


def chat_request(req: ResponsesRequest, conversation: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat request for `conversation`, under the request's instructions, tools, format and limits."""
    messages = ([{"role": "developer", "content": req.instructions}] if req.instructions else []) + conversation
    if not messages:
        raise invalid_request("`input` has no message to answer.", param="input")
    payload: dict[str, Any] = {
        "model": req.model, "messages": messages, "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature, "top_p": req.top_p, "seed": req.seed, "stop": req.stop,
        "user": req.user, "parallel_tool_calls": req.parallel_tool_calls,
        "reasoning_effort": req.reasoning.effort if req.reasoning else None,
        "stream": bool(req.stream), "cache_salt": req.cache_salt, "cache_prompt": req.cache_prompt,
        **req.speculative_chat_fields(),
    }
    if req.tools:
        payload["tools"] = [{"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})}
                            for t in req.tools]
    if req.tool_choice is not None:
        choice = req.tool_choice
        payload["tool_choice"] = choice if isinstance(choice, str) else \
            {"type": "function", "function": {"name": choice.name}}
    fmt = req.text.format if req.text else None
    if fmt is not None and fmt.type == "json_schema":
        payload["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict, "description": fmt.description}}
    elif fmt is not None:
        payload["response_format"] = {"type": fmt.type}
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in payload.items() if v is not None})
    except ValidationError as exc:
        raise responses_param(validation_error(exc)) from None


# Where a chat field's problem comes from in the Responses request.
_PARAMS = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens", "messages": "input", "response_format": "text.format"}


def responses_param(err: Any) -> Any:
    """A chat request's error (its validation, its planning) under the Responses request's field names."""
    if err.param:
        head = err.param.split(".")[0].split("[")[0]
        if head in _PARAMS:
            err.param = _PARAMS[head]
    return err
