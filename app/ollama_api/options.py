"""Ollama's `options` map as our sampling, and `keep_alive` as a duration.

Ollama ignores an option it does not know (it logs a warning); here an unknown key is a 400 naming it, as is a
value of the wrong JSON type or out of range: an option the client thinks it set must not be silently dropped.
Numbers that are not finite never get this far (the body reader refuses them, app/http/request_body.py).

Each known option is one of three kinds:
- mapped to the chat request's sampling field of the same meaning (temperature, top_k, top_p, min_p, seed,
  num_predict as max_tokens, stop, repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty);
- refused unless it asks for what is done anyway: `typical_p` and `tfs_z` other than 1, `mirostat` other than 0
  (samplers this server does not run), `num_ctx` past the model's context (checked with the model, `check_num_ctx`);
- accepted and unused: how a model is loaded is its config's, whoever asks (`num_gpu`, `num_thread`, `num_batch`,
  `use_mmap`...), and options with no effect here (`num_keep`: a prompt is never shifted, one past the context is a
  400; `penalize_newline`, `mirostat_tau`, `mirostat_eta` without mirostat)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ..api.errors import invalid_request
from ..api.schemas import MAX_STOP_CHARS, MAX_STOP_SEQUENCES
from ..config.spec import ModelSpec

INT, FLOAT, BOOL, STRINGS = "integer", "number", "boolean", "array of strings"


@dataclass(frozen=True)
class Option:
    kind: str
    field: str | None = None  # the chat request's field it sets (None: accepted, unused here)
    low: float | None = None
    high: float | None = None
    only: Any = None  # refused unless equal to this (a sampler this server does not run, at its "off" value)
    why: str = ""  # why `only`


_LOADING = "how a model is loaded is set by its config, for every caller"
OPTIONS: dict[str, Option] = {
    "temperature": Option(FLOAT, "temperature", 0, 2),
    "top_k": Option(INT, "top_k", 0, 2**31 - 1),
    "top_p": Option(FLOAT, "top_p", 0, 1),
    "min_p": Option(FLOAT, "min_p", 0, 1),
    "seed": Option(INT, "seed", -(2**63), 2**64 - 1),
    "num_predict": Option(INT, "max_tokens", -2, 2**31 - 1),
    "stop": Option(STRINGS, "stop"),
    "repeat_penalty": Option(FLOAT, "repeat_penalty", 0, 10),
    "repeat_last_n": Option(INT, "penalty_last_n", -1, 2**31 - 1),
    "presence_penalty": Option(FLOAT, "presence_penalty", -2, 2),
    "frequency_penalty": Option(FLOAT, "frequency_penalty", -2, 2),
    "num_ctx": Option(INT, None, 1, 2**31 - 1),
    "typical_p": Option(FLOAT, only=1.0, why="typical sampling is not implemented here"),
    "tfs_z": Option(FLOAT, only=1.0, why="tail-free sampling is not implemented here (llama.cpp removed it)"),
    "mirostat": Option(INT, only=0, why="mirostat sampling is not implemented here"),
    "mirostat_tau": Option(FLOAT), "mirostat_eta": Option(FLOAT),
    "penalize_newline": Option(BOOL), "num_keep": Option(INT, None, -1, 2**31 - 1),
    **{name: Option(kind, why=_LOADING) for name, kind in (
        ("numa", BOOL), ("num_batch", INT), ("num_gpu", INT), ("main_gpu", INT), ("low_vram", BOOL),
        ("f16_kv", BOOL), ("logits_all", BOOL), ("vocab_only", BOOL), ("use_mmap", BOOL), ("use_mlock", BOOL),
        ("num_thread", INT), ("embedding_only", BOOL))},
}


def _shown(key: str) -> str:
    return repr(key if len(key) <= 64 else key[:64] + "...")


def _type_ok(kind: str, value: Any) -> bool:
    if kind == INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == FLOAT:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == BOOL:
        return isinstance(value, bool)
    return isinstance(value, list) and all(isinstance(s, str) for s in value)


def _refused(key: str, message: str) -> Exception:
    return invalid_request(f"options.{key}: {message}", param=f"options.{key}", code="invalid_option")


@dataclass(frozen=True)
class Sampling:
    """What a valid `options` map asks of a generation: the chat request's sampling fields it sets (names as the
    chat request has them; `penalty_last_n` is the engine's), and the context it asked for (None: none)."""

    fields: dict[str, Any]
    num_ctx: int | None = None

    def request_fields(self) -> dict[str, Any]:
        """The fields the chat and legacy requests have (all but `penalty_last_n`, which planning sets)."""
        return {k: v for k, v in self.fields.items() if k != "penalty_last_n"}


def read_options(options: dict[str, Any] | None) -> Sampling:
    """The sampling an `options` map asks for; a 400 naming the first key that is unknown, of the wrong type, out
    of range, or a sampler this server does not run. A null value is no value (as Ollama reads it)."""
    fields: dict[str, Any] = {}
    num_ctx = None
    for key, value in (options or {}).items():
        option = OPTIONS.get(key)
        if option is None:
            raise _refused(_shown(key)[1:-1], f"unknown option {_shown(key)}: this server refuses options it does "
                                              f"not know rather than ignoring them (known: {', '.join(OPTIONS)}).")
        if value is None:
            continue
        if not _type_ok(option.kind, value):
            raise _refused(key, f"must be {'an' if option.kind[0] in 'ai' else 'a'} {option.kind}, not "
                                f"{type(value).__name__} {str(value)[:40]!r}.")
        if option.kind in (INT, FLOAT) and not math.isfinite(value):
            raise _refused(key, "must be a finite number.")
        if option.low is not None and not option.low <= value <= option.high or (key == "repeat_penalty" and value == 0):
            low = "above 0" if key == "repeat_penalty" else f"{option.low:g}"
            raise _refused(key, f"{value} is out of range ({low} to {option.high:g}).")
        if option.only is not None and value != option.only:
            raise _refused(key, f"{option.why}; leave it out (or set {option.only}).")
        if key == "stop":
            _check_stop(value)
        if key == "num_ctx":
            num_ctx = value
        elif key == "num_predict":
            if value == 0:
                raise _refused(key, "must be at least 1, or -1 for no limit (up to the context).")
            if value > 0:
                fields["max_tokens"] = value
        elif key == "seed" and value == -1:
            continue  # Ollama's "random"
        elif option.field is not None:
            fields[option.field] = value
    return Sampling(fields, num_ctx)


def _check_stop(stops: list[str]) -> None:
    if len(stops) > MAX_STOP_SEQUENCES:
        raise _refused("stop", f"at most {MAX_STOP_SEQUENCES} stop sequences are accepted; {len(stops)} were given.")
    if any(not s for s in stops):
        raise _refused("stop", "stop sequences must not be empty.")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise _refused("stop", f"each stop sequence may have at most {MAX_STOP_CHARS} characters.")


def check_num_ctx(sampling: Sampling, spec: ModelSpec) -> None:
    """`num_ctx` within the context the model is served with: a smaller one is accepted (the request is checked
    against the model's context, which holds it); a larger one cannot be given and is a 400."""
    if sampling.num_ctx is not None and sampling.num_ctx > spec.n_ctx:
        raise _refused("num_ctx", f"{sampling.num_ctx} is past the {spec.n_ctx} tokens model `{spec.id}` is served "
                                  f"with (its config's n_ctx); a request cannot enlarge a shared model's context.")


def penalty_window(sampling: Sampling, spec: ModelSpec) -> int | None:
    """`repeat_last_n` as the engine's penalty window: -1 is the whole context (None: not set)."""
    last_n = sampling.fields.get("penalty_last_n")
    return spec.n_ctx if last_n == -1 else last_n


# ---- keep_alive ---------------------------------------------------------------------------------------------

FOREVER = math.inf
_DURATION = re.compile(r"^[+-]?((\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+$")
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value: Any, param: str = "keep_alive") -> float | None:
    """`keep_alive` as seconds: a number of seconds or a duration as Go writes one (`5m`, `1h30m`, `300ms`, `0`);
    negative: forever (FOREVER); None: not given. Anything else is a 400 naming `param`."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and len(value) <= 64:
        text = value.strip()
        if re.fullmatch(r"[+-]?(\d+(\.\d*)?|\.\d+)", text):
            seconds = float(text)  # a bare number: seconds, as a JSON number is
        elif _DURATION.match(text):
            seconds = sum(float(n) * _UNIT_S[unit] for n, unit in _PART.findall(text))
            seconds = -seconds if text.startswith("-") else seconds
        else:
            raise _bad_duration(value, param)
    else:
        raise _bad_duration(value, param)
    if not math.isfinite(seconds):
        raise _bad_duration(value, param)
    return FOREVER if seconds < 0 else seconds


def _bad_duration(value: Any, param: str) -> Exception:
    shown = str(value)[:40]
    return invalid_request(f"{param}: {shown!r} is not a duration: give seconds (a number; negative: keep loaded) or "
                           f"a duration such as \"5m\", \"1h30m\", \"0\".", param=param, code="invalid_keep_alive")

