"""An Ollama request as the request of ours it means: /api/chat and /api/generate as a chat completions request
(then planned, generated and parsed as chat is: the model's template, content marks, grammars, parsers, limits),
and /api/generate with `raw: true` as a legacy completion (the prompt as it is, no template).

- messages: roles as they are; a message's `images` (base64, no MIME type: the decoder tells what they are) become
  image parts before its text; an assistant's `thinking` its `reasoning_content`, its `tool_calls` chat's (the
  arguments object as JSON text, an id made up where the client sent none); a `tool` message answers the call its
  `tool_call_id` names, else the earliest unanswered call of its `tool_name`, else the earliest unanswered one.
- /api/generate: `system` then `prompt` (with `images`) as one user turn.
- `format`: "json" is chat's `json_object`, a JSON schema its `json_schema`, both by grammar.
- `options` (options.py): the sampling fields; `think`: the template's `enable_thinking` (a level: and its
  `reasoning_effort`), and `think: false` drops the reasoning from the reply."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ..api import strict_json
from ..api.schemas import ChatCompletionRequest, CompletionRequest, validation_error
from .options import Sampling
from .schemas import Message, OllamaChatRequest, OllamaGenerateRequest, _Generating


@dataclass(frozen=True)
class MappedChat:
    chat: ChatCompletionRequest


def image_url(data: str) -> dict[str, Any]:
    """An Ollama image (base64, no MIME type) as a chat image part: a data URL that declares no type, so the
    decoder (app/images/decode.py) goes by the bytes."""
    return {"type": "image_url", "image_url": {"url": f"data:;base64,{data}"}}


def _content(text: str, images: list[str] | None) -> str | list[dict[str, Any]]:
    """A message's text and images as chat content: the images first, then the text (where Ollama's own
    templates put them: the text speaks of the images it follows)."""
    if not images:
        return text
    return [*(image_url(i) for i in images), *([{"type": "text", "text": text}] if text else [])]


def chat_messages(messages: list[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    unanswered: list[tuple[str, str]] = []  # (call id, function name) of calls no tool message has answered yet
    for i, m in enumerate(messages):
        if m.role == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": _content(m.content, m.images)}
            if m.thinking:
                entry["reasoning_content"] = m.thinking
            if m.tool_calls:
                calls = []
                for k, call in enumerate(m.tool_calls):
                    call_id = call.id or f"call_{i}_{k}"
                    calls.append({"id": call_id, "type": "function", "function": {
                        "name": call.function.name, "arguments": strict_json.dumps(call.function.arguments)}})
                    unanswered.append((call_id, call.function.name))
                entry["tool_calls"] = calls
            out.append(entry)
        elif m.role == "tool":
            out.append({"role": "tool", "content": m.content, "tool_call_id": _answered(m, unanswered, i)})
        else:
            out.append({"role": m.role, "content": _content(m.content, m.images)})
    return out


def _answered(m: Message, unanswered: list[tuple[str, str]], i: int) -> str:
    """The id of the call a tool message answers (taken off `unanswered`)."""
    pick = next((k for k, (cid, _) in enumerate(unanswered) if m.tool_call_id is not None and cid == m.tool_call_id),
                None)
    if pick is None and m.tool_call_id is None and m.tool_name:
        pick = next((k for k, (_, name) in enumerate(unanswered) if name == m.tool_name), None)
    if pick is None and m.tool_call_id is None and unanswered:
        pick = 0
    if pick is None:
        return m.tool_call_id or f"call_tool_{i}"
    return unanswered.pop(pick)[0]


def response_format(fmt: Any) -> dict[str, Any] | None:
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}


def _think(req: _Generating) -> dict[str, Any]:
    """`think` as chat's reasoning fields (app/generation/reasoning.py): the `enable_thinking` switch for templates
    that read it; `false` is no reasoning (a budget of 0) and hides it, a level is `reasoning_effort`'s budget."""
    if req.think is None:
        return {}
    if req.think is False:
        return {"include_reasoning": False, "chat_template_kwargs": {"enable_thinking": False}}
    if req.think is True:
        return {"chat_template_kwargs": {"enable_thinking": True}}
    return {"reasoning_effort": req.think, "chat_template_kwargs": {"enable_thinking": True}}


def _chat(body: dict[str, Any]) -> ChatCompletionRequest:
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:  # what Ollama's shape allows and chat's does not (a tool without a name...)
        raise validation_error(exc) from None


def to_chat_request(req: OllamaChatRequest | OllamaGenerateRequest, sampling: Sampling) -> MappedChat:
    """The chat request an /api/chat or a templated /api/generate request means."""
    if isinstance(req, OllamaChatRequest):
        messages = chat_messages(req.messages)
    else:
        messages = [{"role": "system", "content": req.system}] if req.system else []
        messages.append({"role": "user", "content": _content(req.prompt, req.images)})
    body: dict[str, Any] = {"model": req.model, "messages": messages, "stream": req.stream,
                            **sampling.request_fields()}
    if isinstance(req, OllamaChatRequest) and req.tools:
        body["tools"] = req.tools
    fmt = response_format(req.format)
    if fmt is not None:
        body["response_format"] = fmt
    body.update(_think(req))
    return MappedChat(_chat(body))


def to_completion_request(req: OllamaGenerateRequest, sampling: Sampling) -> CompletionRequest:
    """The legacy completion a `raw: true` /api/generate request means: its prompt as it is; with a `suffix`, the
    insertion between the two. No default cut at 16 tokens (OpenAI's): without `num_predict`, the model's
    default_max_tokens, else up to the context."""
    body: dict[str, Any] = {"model": req.model, "prompt": req.prompt, "stream": req.stream, "max_tokens": None,
                            **sampling.request_fields()}
    if req.suffix:
        body["suffix"] = req.suffix
    try:
        return CompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None

