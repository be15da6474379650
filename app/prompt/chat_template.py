"""Render a model's own Jinja chat template, sandboxed, the way Hugging Face templates expect.

Message content is data, never template source: `{{ 7*7 }}` typed by a user stays literal text.
Template errors raised on purpose (`raise_exception("roles must alternate")`) are the client's
problem and become 400s; anything else is a server-side template bug.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..api import strict_json
from . import content_marks
from ..api.errors import APIError, invalid_request
from ..engine.params import IMAGE_MARKER


log = logging.getLogger("llamaray.template")


class TemplateRaised(Exception):
    """`raise_exception(...)` called by the template itself."""


def _raise_exception(message: str) -> None:
    raise TemplateRaised(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    # HF's tojson keeps non-ASCII as-is; Jinja's built-in would HTML-escape.
    return strict_json.dumps(value, compact=False, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


@lru_cache(maxsize=16)
def declared_variables(source: str) -> frozenset[str]:
    """The variables a template reads from its context (`enable_thinking`, `reasoning_effort`, ...): a switch is
    passed to a template only where it reads it. None of them for a template that does not compile."""
    from jinja2 import meta

    try:
        ast = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(source)
    except jinja2.TemplateSyntaxError:
        return frozenset()
    return frozenset(meta.find_undeclared_variables(ast))


def check_template(source: str) -> None:
    """Raise ValueError when the template does not even compile (caught at build time)."""
    try:
        compile_template(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"chat template does not compile: {exc.message} (line {exc.lineno})") from None


def content_text(content: Any) -> str:
    """OpenAI content (string or list of text parts) as the plain text a template expects."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def marked_content(content: Any, marker: content_marks.Marker) -> str:
    """A message's content as template text, client text marked: each `image_url` part becomes
    IMAGE_MARKER, outside the marks, so the engine puts that image there (and a client who types the
    marker gets text). Text parts between two images are joined as content_text joins them."""
    if not isinstance(content, list) or not any(part.get("type") == "image_url" for part in content):
        return marker.text(content_text(content))
    out, run = [], []
    for part in content:
        if part.get("type") == "image_url":
            out += [marker.text("".join(run)), IMAGE_MARKER]
            run = []
        elif part.get("type") == "text":
            run.append(part.get("text", ""))
    out.append(marker.text("".join(run)))
    return "".join(out)


def knows_developer_role(source: str) -> bool:
    """Whether a template handles OpenAI's `developer` role itself (most GGUF templates do not)."""
    return "developer" in source


def template_messages(messages: list[dict[str, Any]], mark: bool | content_marks.Marker = False,
                      developer_as_system: bool = False) -> list[dict[str, Any]]:
    """OpenAI messages -> the dicts HF templates read (string content, tool-call args as objects).
    `mark`: client text wrapped in content marks (see content_marks), so it never becomes control tokens
    (a Marker says how; True: marks without slicing delimiters).
    `developer_as_system`: OpenAI's `developer` messages given as `system` (what they mean to a model
    whose template has no developer role)."""
    marker = mark if isinstance(mark, content_marks.Marker) else content_marks.Marker(marks=bool(mark))
    out = []
    for msg in messages:
        role = "system" if developer_as_system and msg["role"] == "developer" else msg["role"]
        m: dict[str, Any] = {"role": role, "content": marked_content(msg.get("content"), marker)}
        for key in ("name", "reasoning_content"):
            if msg.get(key):
                m[key] = marker.text(msg[key])
        if msg.get("tool_call_id"):
            m["tool_call_id"] = marker.ident(msg["tool_call_id"])
        if msg.get("tool_calls"):
            m["tool_calls"] = [_template_call(call, marker) for call in msg["tool_calls"]]
        out.append(m)
    return out


def _template_call(call: dict[str, Any], marker: content_marks.Marker) -> dict[str, Any]:
    fn = call["function"]
    try:
        args: Any = strict_json.loads(fn["arguments"]) if fn.get("arguments") else {}
    except json.JSONDecodeError:
        args = fn["arguments"]
    call_id = call.get("id")
    return {"id": marker.ident(call_id) if isinstance(call_id, str) else call_id, "type": "function",
            "function": {"name": marker.text(fn["name"]), "arguments": marker.value(args)}}


def render_prompt(
    source: str,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    extra: dict[str, Any] | None = None,
    mark_content: bool = False,
) -> str:
    """The prompt text. `mark_content`: every client string is marked for the engine, which tokenizes
    it without special-token parsing (content_marks), marks placed to survive the template's own
    slicing; off, the plain text (tests, logs). prompt_check.checked_prompt adds the check."""
    marker = content_marks.Marker(mark_content, content_marks.slice_delimiters(source) if mark_content else ())
    messages = template_messages(messages, marker, developer_as_system=not knows_developer_role(source))
    tools = marker.tools(tools)
    template = compile_template(source)
    try:
        prompt = template.render(
            messages=messages,
            tools=tools or None,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **(extra or {}),
        )
    except TemplateRaised as exc:  # the template author's own words, meant for the client
        raise invalid_request(f"The model's chat template rejected the messages: {exc}", param="messages") from None
    except Exception as exc:  # noqa: BLE001 - a template bug (even 1/0, or an unsafe operation) is a clean 500
        # Jinja's text names the template's internals: it goes to the log, never to the client.
        log.error("the chat template failed to render: %r", exc, exc_info=exc)
        raise APIError("The model's chat template failed to render this conversation (see the server log).",
                       status=500, type="server_error", code="chat_template_error", logged=True) from None
    # A template that escapes (tojson with ensure_ascii) spelled marks as `\\ufdd0`: marks again.
    return content_marks.unescape(prompt) if mark_content else prompt
