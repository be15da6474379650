"""What the engine says when it cannot serve a request: engine errors, in the engine's own terms.

An EngineError has a `kind` (what sort of failure: the input, the context, the engine's state) and, for bad
input, the `subject` it concerns: a field of the engine's request or job (`prompt`, `images`, `logprobs`,
`n`, `grammar`, `tokens[2]`, `input[1]`, ...). It knows no HTTP status and no protocol: the edge that hands
engine failures to the processing (app/api/engine_errors.py, through `as_api_error`) maps it to the
protocol's error. `code` is a stable machine-readable reason (`n_too_large`, `invalid_token`), which the
edge passes on as the error's code.

Engine errors cross Ray hops (inside a `Failed` event, or inside RayTaskError): each pickles by its
fields (`__reduce__`), as exceptions with keyword-only arguments do not by default.
"""

from __future__ import annotations

from typing import Any, Literal

Kind = Literal["bad_input", "context_exceeded", "not_found", "overloaded", "unavailable", "timeout", "internal"]


class EngineError(Exception):
    """A request the engine cannot serve. `logged`: the cause (with its traceback) is in the log already."""

    def __init__(self, kind: Kind, message: str, *, subject: str | None = None, code: str | None = None,
                 logged: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.subject = subject
        self.code = code
        self.logged = logged

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (self.kind, self.message, self.subject, self.code, self.logged)

    def __repr__(self) -> str:
        return f"EngineError({self.kind}, {self.message!r}, subject={self.subject!r}, code={self.code!r})"


def _rebuild(kind: Kind, message: str, subject: str | None, code: str | None, logged: bool) -> EngineError:
    return EngineError(kind, message, subject=subject, code=code, logged=logged)


class ContextExceeded(EngineError):
    """The prompt (and the completion asked for) does not fit the model's context. The numbers, not a
    sentence: the protocol words it (`messages` on the chat route, `prompt` on the legacy one).
    `at_least`: `prompt_tokens` is a lower bound (what the prompt's size proves before tokenizing it)."""

    def __init__(self, n_ctx: int, prompt_tokens: int, max_tokens: int | None, at_least: bool = False) -> None:
        some = "at least " if at_least else ""
        asked = f" + {max_tokens} to generate" if max_tokens is not None else ""
        super().__init__("context_exceeded", f"{some}{prompt_tokens} prompt tokens{asked} exceed the context of "
                         f"{n_ctx} tokens", subject="prompt", code="context_length_exceeded")
        self.n_ctx = n_ctx
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.at_least = at_least

    def __reduce__(self) -> tuple[Any, ...]:
        return ContextExceeded, (self.n_ctx, self.prompt_tokens, self.max_tokens, self.at_least)


def bad_input(message: str, subject: str, code: str) -> EngineError:
    """The request's `subject` is something the engine cannot take (the client's to change)."""
    return EngineError("bad_input", message, subject=subject, code=code)


def not_found(message: str, subject: str, code: str) -> EngineError:
    """The request names something the engine does not have (an adapter not loaded)."""
    return EngineError("not_found", message, subject=subject, code=code)


def unavailable(message: str, code: str = "engine_unavailable") -> EngineError:
    """The engine cannot take requests (its decode thread stopped); a retry elsewhere or later may work."""
    return EngineError("unavailable", message, code=code)


def overloaded(message: str, code: str = "overloaded") -> EngineError:
    """The engine will not run the request now (its slots went to others); the same request later may run."""
    return EngineError("overloaded", message, code=code)


def internal(message: str, code: str = "internal_error", logged: bool = True) -> EngineError:
    """The engine failed on this request (llama.cpp refused a batch, the projector failed): not the client's
    doing. Logged with its cause where it is made, by default."""
    return EngineError("internal", message, code=code, logged=logged)
