"""Follows a call region's JSON as it arrives, so a call's arguments stream while they are generated.

A region's JSON body is a call object ``{"name": "f", "arguments": {...}}`` (``"parameters"`` too), a
list of them, or, when the name came before the JSON (Mistral's ``f[ARGS]{...}``), a bare arguments
object. A call is *committed* (its header may be sent) once its name is known and allowed and its
arguments object has opened; from then on the raw text of that object is released as it comes, up
to its closing brace.

Only the order every grammar and most models produce is followed: ``{`` name, then the arguments
object. Anything else (arguments before the name, arguments given as a JSON string, another key in
between, a name that is not allowed) stops following the region: its calls from there on are held
until the region closes and are judged whole, as before streaming.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...api import strict_json
from ..partial import JsonEndScanner

_WS = " \t\n\r"
_ARGS_KEYS = ('"arguments"', '"parameters"')

# stages of the walk over a region's body
_VALUE, _OBJECT, _ARGS, _REST, _NEXT, _STOP = range(6)


@dataclass(slots=True)
class Committed:
    """A call whose header went out: its arguments are ``text[start:sent]`` so far."""

    name: str
    start: int
    scan: JsonEndScanner
    sent: int


Event = tuple[int, str | None, str]
"""``(ordinal of the call in the region, name for a new call else None, arguments fragment)``."""


class ArgStream:
    def __init__(self, start: int, *, name: str | None = None,
                 allowed: frozenset[str] | None = None) -> None:
        self.calls: list[Committed] = []
        self._pos = start
        self._name = name
        self._allowed = allowed
        self._stage = _VALUE
        self._in_list = False
        self._object: JsonEndScanner | None = None  # the call object being read

    def advance(self, text: str, end: int) -> list[Event]:
        """Read ``text[:end]`` (the body so far; never past the region's end): new commits and
        argument fragments."""
        out: list[Event] = []
        while self._stage != _STOP and self._step(text, end, out):
            pass
        return out

    # -- walk ------------------------------------------------------------
    def _step(self, text: str, end: int, out: list[Event]) -> bool:
        """One stage; False to wait for more text (or when stopped)."""
        pos = self._pos = _skip_ws(text, self._pos, end)
        stage = self._stage
        if stage == _ARGS:
            return self._release(text, end, out)
        if stage == _REST:
            close = self._object.end(text, end)  # type: ignore[union-attr]  # set with the call
            if close < 0:
                return False
            self._pos, self._stage = close, _NEXT if self._in_list else _STOP
            return True
        if pos >= end:
            return False
        c = text[pos]
        if stage == _VALUE:
            if self._name is not None:
                return self._commit(self._name, pos, out) if c == "{" else self._stop()
            if c == "[":
                self._in_list, self._pos, self._stage = True, pos + 1, _OBJECT
                return True
            self._stage = _OBJECT
            return True
        if stage == _NEXT:
            if c != ",":
                return self._stop()
            self._pos, self._stage = pos + 1, _OBJECT
            return True
        # _OBJECT
        if c != "{":
            return self._stop()
        head = _header(text, pos, end)
        if head is None:
            return False
        if head is False:
            return self._stop()
        name, args_at = head
        self._object = JsonEndScanner(pos)
        return self._commit(name, args_at, out)

    def _commit(self, name: str, args_at: int, out: list[Event]) -> bool:
        if not name or (self._allowed is not None and name not in self._allowed):
            return self._stop()
        out.append((len(self.calls), name, ""))
        self.calls.append(Committed(name, args_at, JsonEndScanner(args_at), args_at))
        self._pos, self._stage = args_at, _ARGS
        return True

    def _release(self, text: str, end: int, out: list[Event]) -> bool:
        call = self.calls[-1]
        close = call.scan.end(text, end)
        upto = end if close < 0 else close
        if upto > call.sent:
            out.append((len(self.calls) - 1, None, text[call.sent:upto]))
            call.sent = upto
        if close < 0:
            return False
        self._pos = close
        self._stage = _STOP if self._name is not None else _REST
        return True

    def _stop(self) -> bool:
        self._stage = _STOP
        return False


def _skip_ws(text: str, i: int, end: int) -> int:
    while i < end and text[i] in _WS:
        i += 1
    return i


def _header(text: str, i: int, end: int) -> tuple[str, int] | bool | None:
    """``{"name": "<name>", "arguments": {`` at ``text[i]``: ``(name, index of the arguments' brace)``;
    None while the text may still become that; False when it cannot."""
    name = ""
    i += 1
    for want in (('"name"',), (":",), None, (",",), _ARGS_KEYS, (":",)):
        i = _skip_ws(text, i, end)
        if want is not None:
            got = _literal(text, i, end, want)
            if got is None or got < 0:
                return None if got is None else False
            i = got
            continue
        if i >= end:  # the name, a JSON string
            return None
        if text[i] != '"':
            return False
        j = _string_end(text, i, end)
        if j < 0:
            return None
        try:
            name = strict_json.loads(text[i:j])
        except ValueError:
            return False
        i = j
    i = _skip_ws(text, i, end)
    if i >= end:
        return None
    return (name, i) if text[i] == "{" else False


def _literal(text: str, i: int, end: int, options: tuple[str, ...]) -> int | None:
    """Index past whichever of ``options`` is at ``text[i]``; None if one may still come, else -1."""
    got = text[i:min(end, i + max(map(len, options)))]
    for lit in options:
        if got.startswith(lit):
            return i + len(lit)
    return None if any(lit.startswith(got) for lit in options) else -1


def _string_end(text: str, i: int, end: int) -> int:
    """Index just past the JSON string opened at ``text[i]``, or -1 while it is open."""
    j = i + 1
    while j < end:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        j += 1
    return -1
