"""Tool parser base: a streaming machine over "prose, call region, prose, ...".

A subclass says where a call region may start (``_scan``) and how a region
ends and what calls it holds (``_take``); while a region is open it points the
base class at the region's JSON (``_follow``). The base class does the rest:

* Prose streams as content; a possible marker prefix at the buffer end is
  held back, so no marker fragment is ever emitted.
* A call streams in OpenAI's shape: a header ``CallDelta`` (``index``, ``id``,
  ``name``, ``arguments=""``) as soon as its name is known and allowed and its
  arguments object has opened, then the raw text of that object in fragments
  as it arrives (``argstream.ArgStream``). Calls the stream cannot follow
  (arguments before the name, arguments as a JSON string, a Python call list)
  are held until the region closes, then sent as a header and the arguments.
* Arguments are the raw JSON text the model wrote for the arguments object
  (an arguments *string* holding an object: that string, stripped; no
  arguments: ``"{}"``), in streaming and in ``parse`` alike.
* A region none of whose calls went out that is not a valid call (bad JSON,
  not call-shaped, an unknown name, cut by the end of the stream) is not
  claimed: its raw text comes back as content.
* Once a call's header went out the region is a call region for good, since
  the client already has it: a call cut by the end of the stream, or whose
  JSON breaks, keeps the arguments the model wrote up to where its arguments
  object closed or the region ended (they may then not be valid JSON: the
  client has exactly what was generated, as OpenAI does for a cut call). The
  region's other text (a broken wrapper, later calls that are not valid and
  allowed) is dropped, never sent as content or as a call.
* Whitespace next to a claimed call is dropped (``EdgeTrim``), so
  ``"Sure.\\n<tool_call>...</tool_call>\\n"`` gives content ``"Sure."``.
* ``parse(text)`` runs the same machine over the whole text, so streaming and
  non-streaming agree for any split of the text into pieces.
"""
from __future__ import annotations

import json
from typing import Any, ClassVar

from ...api import strict_json
from ..deltas import CallDelta, Delta, ToolCall, ToolDelta, new_call_id
from ..partial import EdgeTrim, JsonEndScanner, StreamMachine, partial_prefix_len
from .argstream import ArgStream

Call = tuple[str, str]  # (name, arguments: the JSON object's text)

_DECODER = json.JSONDecoder()
_WS = " \t\n\r"


def calls_from_json(text: str, *, require_args: bool = False) -> list[Call] | None:
    """A JSON call object or a non-empty list of them -> calls, else None.

    A call object is ``{"name": str, "arguments"|"parameters": {...}}``; its
    arguments are the object's raw text. Arguments given as a JSON string
    holding an object are accepted (that string, stripped). Missing arguments
    mean ``{}`` unless ``require_args``.
    """
    try:
        obj = strict_json.loads(text)
    except ValueError:
        return None
    start = _ws(text, 0)
    items = _spans(text, start) if isinstance(obj, list) else [(obj, start, len(text.rstrip(_WS)))]
    calls = [_call(text, value, a, require_args) for value, a, _ in items]
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


def _call(text: str, obj: Any, at: int, require_args: bool) -> Call | None:
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    key = next((k for k in ("arguments", "parameters") if k in obj), None)
    if key is None:
        return None if require_args else (name, "{}")
    args = obj[key]
    if isinstance(args, str):
        try:
            inner = strict_json.loads(args)
        except ValueError:
            return None
        return (name, args.strip()) if isinstance(inner, dict) else None
    if not isinstance(args, dict):
        return None
    # the raw text: the last member with this key, as json.loads keeps the last one
    a, b = [(a, b) for k, a, b in _spans(text, at, keys=True) if k == key][-1]
    return name, text[a:b]


def _ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _spans(text: str, i: int, *, keys: bool = False) -> list:
    """The elements (``(value, start, end)``) of the valid JSON array opened at ``text[i]``, or with
    ``keys`` the members (``(key, start, end)`` of each value) of the object opened there."""
    out: list = []
    close = "}" if keys else "]"
    i = _ws(text, i + 1)
    if text[i] == close:
        return out
    while True:
        if keys:
            key, i = _DECODER.raw_decode(text, i)
            i = _ws(text, _ws(text, i) + 1)  # past the ":"
        value, j = _DECODER.raw_decode(text, i)
        out.append((key if keys else value, i, j))
        i = _ws(text, j)
        if text[i] == close:
            return out
        i = _ws(text, i + 1)  # past the ","


class ToolParser(StreamMachine):
    name: ClassVar[str]
    # Where a call region starts, for formats marked by one literal (the default `_scan`).
    start_marker: ClassVar[str] = ""

    def __init__(self, allowed_names: frozenset[str] | None = None) -> None:
        super().__init__()
        # When set, a call to any other name is not claimed (its text stays content):
        # a client never receives a call to a function it did not offer.
        self.allowed_names = allowed_names
        self._in_call = False
        self._trim = EdgeTrim()
        self._said = False  # some content was emitted
        self._count = 0
        self._region: dict[str, Any] = {}  # per-region scratch, cleared when a region ends
        self._queued: list[ToolDelta] = []  # deltas `_follow` made during a `_take`

    # -- hooks -----------------------------------------------------------
    def _scan(self, buf: str, final: bool) -> tuple[int, int]:
        """Where a call region starts in ``buf`` (-1: none), and how many
        chars at the end to hold back when none starts."""
        i = buf.find(self.start_marker)
        return (i, 0) if i >= 0 else (-1, partial_prefix_len(buf, (self.start_marker,)))

    def _take(self, buf: str, final: bool) -> tuple[int, list[Call] | None] | None:
        """``buf`` starts a region: ``(length, calls)``, ``(length, None)`` when
        the region is not a call (raw text -> content), or None to wait for
        more text (never when ``final``). ``length`` > 0."""
        raise NotImplementedError

    def _follow(self, buf: str, start: int, end: int, *, name: str | None = None) -> None:
        """Called by ``_take`` while a region is open and when it closes: the region's JSON body
        starts at ``buf[start]`` and may be read up to ``end`` (never past the region's end).
        ``name``: the call's name came before the JSON, which is its arguments object."""
        stream = self._region.get("stream")
        if stream is None:
            stream = self._region["stream"] = ArgStream(start, name=name, allowed=self.allowed_names)
        for k, head, fragment in stream.advance(buf, end):
            if head is not None:
                if "first" not in self._region:  # the region's first call: the region is claimed
                    self._trim.cut()
                    self._trim.separate = self._said
                    self._region["first"] = self._count
                self._count += 1
                self._queued.append(CallDelta(self._region["first"] + k, "", new_call_id(), head))
            else:
                self._queued.append(CallDelta(self._region["first"] + k, fragment))

    @property
    def _claimed(self) -> bool:
        """The open region has sent a call: it is a call region whatever follows."""
        stream = self._region.get("stream")
        return stream is not None and bool(stream.calls)

    def _json_open(self, buf: str) -> bool:
        """While waiting on a region: is its JSON still unclosed?"""
        return True

    def _json_at(self, buf: str, pos: int, final: bool, *,
                 python: bool = False) -> tuple[int, bool] | None:
        """The JSON value (or Python list) opened at ``buf[pos]``:
        ``(end, True)`` when closed, ``(len(buf), False)`` when the stream
        ended inside it, None to wait. Scans incrementally across feeds."""
        scanner = self._region.get("json")
        if scanner is None or scanner.start != pos:
            scanner = self._region["json"] = JsonEndScanner(pos, python=python)
        end = scanner.end(buf)
        if end >= 0:
            return end, True
        return (len(buf), False) if final else None

    # -- public ----------------------------------------------------------
    def _tail(self) -> list[ToolDelta]:
        return self._content(self._trim.flush())

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """Non-streaming: ``(content around the calls, calls)``."""
        p = self._fresh()
        content: list[str] = []
        calls: dict[int, list[str]] = {}
        for d in p.feed(text) + p.finish():
            if isinstance(d, Delta):
                content.append(d.text)
            elif d.id is not None:
                calls[d.index] = [d.id, d.name, d.arguments]
            else:
                calls[d.index][2] += d.arguments
        return "".join(content), [ToolCall(*calls[i]) for i in sorted(calls)]

    def has_open_call(self, text: str) -> bool:
        """True when ``text`` ends inside a call whose JSON is not closed yet."""
        p = self._fresh()
        p.feed(text)
        return p._in_call and p._json_open(p._buf)

    def _fresh(self) -> "ToolParser":
        return type(self)(self.allowed_names)

    def _allowed(self, calls: list[Call]) -> bool:
        return self.allowed_names is None or all(name in self.allowed_names for name, _ in calls)

    # -- machine ---------------------------------------------------------
    def _content(self, text: str) -> list[ToolDelta]:
        if not text:
            return []
        self._said = True
        return [Delta("content", text)]

    def _drain(self, final: bool) -> list[ToolDelta]:
        out: list[ToolDelta] = []
        buf = self._buf
        while True:
            if not self._in_call:
                i, keep = self._scan(buf, final)
                if i < 0:
                    cut = len(buf) if final else len(buf) - keep
                    out += self._content(self._trim.push(buf[:cut]))
                    buf = buf[cut:]
                    break
                out += self._content(self._trim.push(buf[:i]))
                buf = buf[i:]
                self._in_call = True
            taken = self._take(buf, final)
            out += self._queued
            self._queued = []
            if taken is None:
                break
            n, calls = taken
            region, buf = buf[:n], buf[n:]
            self._in_call = False
            out += self._close(region, calls)
            self._region.clear()
        self._buf = buf
        return _merge_content(out)

    def _close(self, region: str, calls: list[Call] | None) -> list[ToolDelta]:
        """The region's end: its calls not sent yet, or its text as content when it is no call."""
        stream = self._region.get("stream")
        sent = len(stream.calls) if stream is not None else 0
        valid = calls is not None and self._allowed(calls)
        if not sent and not valid:
            return self._content(self._trim.push(region))
        if not sent:
            self._trim.cut()
            # prose on both sides of the call must not join up into a marker ("<tool_" + "call>")
            self._trim.separate = self._said
        out: list[ToolDelta] = []
        for name, args in calls[sent:] if valid and calls else []:
            # OpenAI's streaming shape: a header (index, id, name), then the arguments.
            out.append(CallDelta(self._count, "", new_call_id(), name))
            out.append(CallDelta(self._count, args))
            self._count += 1
        return out


def _merge_content(deltas: list[ToolDelta]) -> list[ToolDelta]:
    out: list[ToolDelta] = []
    for d in deltas:
        if isinstance(d, Delta) and out and isinstance(out[-1], Delta):
            out[-1] = Delta("content", out[-1].text + d.text)
        else:
            out.append(d)
    return out
