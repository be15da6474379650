"""Stop sequences on a text stream: never emit text that might turn out to be part of a stop."""

from __future__ import annotations

from collections.abc import Iterable


class StopMatcher:
    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self.matched: str | None = None  # the stop sequence that ended the text, once one has

    def feed(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit, whether a stop matched). After a match, stop feeding."""
        if not self.stops:
            return text, False
        buf = self._held + text
        hits = [(i, s) for s in self.stops if (i := buf.find(s)) >= 0]
        if hits:
            # The stop that completes first wins, as it would token by token: the cut then
            # does not depend on how the text was split into pieces.
            cut, self.matched = min(hits, key=lambda h: (h[0] + len(h[1]), h[0]))
            self._held = ""
            return buf[:cut], True
        keep = partial_prefix_len(buf, self.stops)  # a stop may be completed by the next piece
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        out, self._held = self._held, ""
        return out


def partial_prefix_len(buf: str, markers: Iterable[str]) -> int:
    """Length of the longest suffix of ``buf`` that is a *proper* prefix of a marker.

    That suffix is the minimum that must be held back so that no fragment of
    a marker is ever emitted; everything before it can be emitted safely.
    """
    markers = tuple(markers)
    longest = max((len(m) for m in markers), default=0)
    for k in range(min(len(buf), longest - 1), 0, -1):
        tail = buf[-k:]
        if any(len(m) > k and m.startswith(tail) for m in markers):
            return k
    return 0
