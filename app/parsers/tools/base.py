"""Tool parser base: a streaming machine over "prose, call region, prose, ...".

A subclass says where a call region may start (``_scan``) and how a region
ends and what calls it holds (``_take``). The base class does the rest:

* Prose streams as content; a possible marker prefix at the buffer end is
  held back, so no marker fragment is ever emitted.
* A call region is buffered until it is complete (its JSON closed), then
  emitted in OpenAI's streaming shape: a header ``CallDelta`` (``index``,
  ``id``, ``name``) and one carrying the whole ``arguments`` string.
* Arguments are canonical: ``json.dumps(obj, ensure_ascii=False)`` of the
  parsed arguments object, in streaming and in ``parse`` alike.
* A region that is not a valid call (bad JSON, not call-shaped, cut by the
  end of the stream) is not claimed: its raw text comes back as content.
* Whitespace next to a claimed call is dropped (``EdgeTrim``), so
  ``"Sure.\\n<tool_call>...</tool_call>\\n"`` gives content ``"Sure."``.
* ``parse(text)`` runs the same machine over the whole text, so streaming and
  non-streaming agree for any split of the text into pieces.
"""
from __future__ import annotations

import json
from typing import Any, ClassVar

from ..deltas import CallDelta, Delta, ToolCall, ToolDelta, new_call_id
from ..partial import EdgeTrim, JsonEndScanner, StreamMachine, partial_prefix_len

Call = tuple[str, str]  # (name, arguments as canonical JSON object string)


def call_from_obj(obj: Any, *, require_args: bool = False) -> Call | None:
    """``{"name": str, "arguments"|"parameters": {...}}`` -> ``(name, args_json)``.

    Arguments given as a JSON string holding an object are accepted. Missing
    arguments mean ``{}`` unless ``require_args``.
    """
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    for key in ("arguments", "parameters"):
        if key in obj:
            args = obj[key]
            break
    else:
        if require_args:
            return None
        args = {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return name, json.dumps(args, ensure_ascii=False)


def calls_from_json(text: str, *, require_args: bool = False) -> list[Call] | None:
    """A JSON call object or a non-empty list of them -> calls, else None."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    items = obj if isinstance(obj, list) else [obj]
    calls = [call_from_obj(o, require_args=require_args) for o in items]
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


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
            if taken is None:
                break
            n, calls = taken
            region, buf = buf[:n], buf[n:]
            self._in_call = False
            self._region.clear()
            if calls and self._allowed(calls):
                self._trim.cut()
                # prose on both sides of the call must not join up into a marker ("<tool_" + "call>")
                self._trim.separate = self._said
                for name, args in calls:
                    # OpenAI's streaming shape: a header (index, id, name), then the arguments.
                    out.append(CallDelta(self._count, "", new_call_id(), name))
                    out.append(CallDelta(self._count, args))
                    self._count += 1
            else:
                out += self._content(self._trim.push(region))
        self._buf = buf
        return _merge_content(out)


def _merge_content(deltas: list[ToolDelta]) -> list[ToolDelta]:
    out: list[ToolDelta] = []
    for d in deltas:
        if isinstance(d, Delta) and out and isinstance(out[-1], Delta):
            out[-1] = Delta("content", out[-1].text + d.text)
        else:
            out.append(d)
    return out
