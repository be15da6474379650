"""A batch's input checked line by line before anything runs, in one pass linear in the file, with bounded memory
(lines.py): each line is UTF-8 strict JSON within the limits, an object with a `custom_id` used once in the file,
`method: POST`, the batch's `url`, and a `body` that the endpoint's own parser accepts (the same strict schema
and refusals as the HTTP route), naming a model the key may use. What comes out is the batch's plan: each good
line's place in the file, its model and its prompt's prefix key (lines with the same prefix are sent together, so
the prompt cache serves them), and the lines refused, by number.

OpenAI refuses a whole batch for one bad line (the batch `failed`, its `errors` naming the lines); a Message Batch
answers each bad request as `errored` and runs the rest (runner.py decides which)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..api import strict_json
from ..api.errors import APIError, as_api_error, served_model
from ..config.spec import ModelSpec
from ..generation.adapters import served_target
from ..tenants.policies import KeyPolicy
from .endpoints import Endpoint
from .lines import raw_lines

# How many refused lines a failed batch names (OpenAI names some, not necessarily all).
MAX_ERRORS = 100
CUSTOM_ID_MAX = 512


class LineError(Exception):
    """A refused line: its number, OpenAI's `code`, `message` and `param`, its `custom_id` when the line got that
    far (a Message Batch answers it under that id) and the status its request would have had."""

    def __init__(self, line: int, code: str, message: str, param: str | None = None, custom_id: str | None = None,
                 status: int = 400) -> None:
        super().__init__(message)
        self.line, self.code, self.message, self.param = line, code, message, param
        self.custom_id, self.status = custom_id, status

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line, "code": self.code, "message": self.message, "param": self.param,
                "custom_id": self.custom_id, "status": self.status}

    def to_openai(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


@dataclass(frozen=True)
class PlannedLine:
    line: int
    offset: int
    length: int
    model: str  # the base model it runs on (the runner's window for it)
    prefix: int  # its prompt's leading part, as a 64-bit key


@dataclass
class Plan:
    lines: list[PlannedLine] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)
    refused: int = 0  # lines refused in all (errors holds the first MAX_ERRORS)
    total: int = 0  # requests in the file (blank lines are not)

    @property
    def models(self) -> list[str]:
        return sorted({p.model for p in self.lines})

    def order(self) -> list[PlannedLine]:
        """The order lines are sent in: by prefix (a prompt's cached prefix serves the lines after it), then as
        they are in the file."""
        return sorted(self.lines, key=lambda p: (p.prefix, p.line))

    def to_json(self) -> bytes:
        models = self.models
        index = {m: i for i, m in enumerate(models)}
        return json.dumps({"total": self.total, "refused": self.refused, "models": models,
                           "lines": [[p.line, p.offset, p.length, index[p.model], p.prefix] for p in self.lines],
                           "errors": [e.to_dict() for e in self.errors]}, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, blob: bytes) -> "Plan":
        data = json.loads(blob)
        models = data["models"]
        return cls([PlannedLine(line, offset, length, models[m], prefix)
                    for line, offset, length, m, prefix in data["lines"]],
                   [LineError(**e) for e in data["errors"]], data["refused"], data["total"])


class LineCheck:
    """One line's checks for a batch of `endpoint` run by the key with `policy`, over the configured `models`."""

    def __init__(self, endpoint: Endpoint, models: Mapping[str, ModelSpec], policy: KeyPolicy | None,
                 max_messages: int = 1024) -> None:
        self.endpoint = endpoint
        self.models = models
        self.policy = policy
        self.max_messages = max_messages

    def read(self, number: int, data: bytes) -> tuple[str, Any, dict[str, Any]]:
        """The line's custom_id, the endpoint's typed request and its decoded body; a LineError if refused."""
        line = _decoded(number, data)
        custom_id = line.get("custom_id")
        if not isinstance(custom_id, str) or not 0 < len(custom_id) <= CUSTOM_ID_MAX:
            raise LineError(number, "invalid_request", f"Line {number}: `custom_id` must be a string of 1 to "
                            f"{CUSTOM_ID_MAX} characters.", "custom_id")
        if line.get("method") != "POST":
            raise LineError(number, "invalid_request", f"Line {number}: `method` must be \"POST\".", "method",
                            custom_id)
        if line.get("url") != self.endpoint.url:
            raise LineError(number, "mismatched_endpoint", f"Line {number}: `url` is {line.get('url')!r}, but this "
                            f"batch's endpoint is {self.endpoint.url!r}: every line must name it.", "url",
                            custom_id)
        body = line.get("body")
        if not isinstance(body, dict):
            raise LineError(number, "invalid_request", f"Line {number}: `body` must be a JSON object.", "body",
                            custom_id)
        if body.get("stream") not in (None, False):
            raise LineError(number, "invalid_request", f"Line {number}: a batch line cannot stream: leave "
                            "`body.stream` out or false.", "body.stream", custom_id)
        try:
            request = self.endpoint.parse(body)
            self._check(request)
        except APIError as exc:
            param = f"body.{exc.param}" if exc.param else "body"
            raise LineError(number, exc.code or "invalid_request", f"Line {number}: {exc.message}", param, custom_id,
                            exc.status) from None
        return custom_id, request, body

    def _check(self, request: Any) -> None:
        """What the Ingress checks of a request before the processing (its messages' count), and the model it
        names: configured, of the endpoint's kind, and one the key may use (else the 404 of an unknown model)."""
        messages = getattr(request, "messages", None) or []
        if len(messages) > self.max_messages:
            raise APIError(f"Too many messages: {len(messages)} (this server accepts at most {self.max_messages}).",
                           param="messages", code="too_many_messages", status=400, type="invalid_request_error")
        if self.endpoint.kind == "chat":
            served_target(self.models, request.model, "chat", self.endpoint.url, getattr(request, "lora", None),
                          self.policy)
        else:
            served_model(self.models, request.model, self.endpoint.kind, self.endpoint.url, self.policy)

    def base_model(self, request: Any) -> str:
        if self.endpoint.kind == "chat":
            return served_target(self.models, request.model, "chat", self.endpoint.url,
                                 getattr(request, "lora", None), self.policy).spec.id
        return request.model


def _decoded(number: int, data: bytes) -> dict[str, Any]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LineError(number, "invalid_json_line", f"Line {number} is not UTF-8 text (byte {exc.start} of the "
                        "line).") from None
    try:
        value = strict_json.loads(text)
    except RecursionError:
        value = None
    except ValueError as exc:
        raise LineError(number, "invalid_json_line", f"Line {number} is not valid JSON: {exc}.") from None
    problem = strict_json.structure_problem(value, strict_json.MAX_DEPTH) if value is not None else (
        f"The JSON body is nested too deeply (at most {strict_json.MAX_DEPTH} levels).")
    if problem:
        raise LineError(number, "invalid_json_line", f"Line {number}: {problem}")
    if not isinstance(value, dict):
        raise LineError(number, "invalid_json_line", f"Line {number} is not a JSON object.")
    return value


def prefix_key(endpoint: Endpoint, model: str, body: Mapping[str, Any]) -> int:
    """The key of what a request's prompt starts with (its model, and its system prompt and first message, its
    instructions, or its prompt's first characters): lines with the same key are sent one after another."""
    if endpoint.embeddings:
        lead: Any = None
    elif "messages" in body:  # chat, Anthropic's messages
        messages = body.get("messages")
        first = messages[0] if isinstance(messages, list) and messages else None
        lead = [body.get("system"), body.get("tools"), first]
    elif "input" in body or "instructions" in body:  # Responses
        items = body.get("input")
        first = items[:512] if isinstance(items, str) else (items[0] if isinstance(items, list) and items else None)
        lead = [body.get("instructions"), body.get("tools"), first]
    else:  # legacy completions
        prompt = body.get("prompt")
        lead = prompt[:512] if isinstance(prompt, str) else (prompt[0] if isinstance(prompt, list) and prompt else None)
    digest = hashlib.blake2b(strict_json.dumps([model, lead], sort_keys=True).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1  # fits a signed 64-bit integer too


def validate(blocks: Iterable[bytes], check: LineCheck, *, max_lines: int, max_line_bytes: int,
             stop_at_first: bool = False) -> Plan:
    """The plan of the file given as `blocks` (linear in it; memory: one block, and a few words per line).
    `stop_at_first`: done at the first refused line (OpenAI's batch fails whole; naming the first suffices)."""
    plan = Plan()
    seen: set[bytes] = set()

    def refuse(error: LineError) -> None:
        plan.refused += 1
        if len(plan.errors) < MAX_ERRORS:
            plan.errors.append(error)

    for raw in raw_lines(blocks, max_line_bytes):
        if raw.data is not None and not raw.data.strip():
            continue
        plan.total += 1
        if plan.total > max_lines:
            refuse(LineError(raw.number, "too_many_requests", f"The file holds more than {max_lines} requests, the "
                             "most one batch may have (batch.max_lines).", None))
            break
        if raw.data is None:
            refuse(LineError(raw.number, "line_too_long", f"Line {raw.number} is {raw.length} bytes: a line may "
                             f"have at most {max_line_bytes} (one request's body).", None))
        else:
            try:
                custom_id, request, body = check.read(raw.number, raw.data)
                digest = hashlib.blake2b(custom_id.encode(), digest_size=16).digest()
                if digest in seen:
                    raise LineError(raw.number, "duplicate_custom_id", f"Line {raw.number}: `custom_id` "
                                    f"{custom_id!r} is used by an earlier line: each must be unique in the batch.",
                                    "custom_id", None)
                seen.add(digest)
                model = check.base_model(request)
                plan.lines.append(PlannedLine(raw.number, raw.offset, raw.length, model,
                                              prefix_key(check.endpoint, model, body)))
                continue
            except LineError as error:
                refuse(error)
            except Exception as exc:  # noqa: BLE001 - a parser's surprise is this line's refusal, not a crash
                api = as_api_error(exc)
                refuse(LineError(raw.number, "invalid_request", f"Line {raw.number}: "
                                 f"{api.message if api else 'the request could not be read'}."))
        if stop_at_first and plan.errors:
            break
    if plan.total == 0 and not plan.errors:
        refuse(LineError(1, "empty_file", "The input file holds no requests.", None))
    return plan
