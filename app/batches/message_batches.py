"""Anthropic's Message Batches on the batch machinery: the body of `POST /v1/messages/batches` (`{"requests": [{
"custom_id", "params"}, ...]}`, up to hundreds of MB) read as it arrives, each request made a line of the batch's
input in OpenAI's line form (`url: /v1/messages`), so the runner treats both protocols' batches alike.

The body is scanned, not parsed whole: a request's bytes are found by tracking strings and nesting (the scan
jumps between the few bytes that matter, so it is linear and fast), held only until its end (at most
`max_line_bytes`), then read as JSON on its own. What Anthropic checks when a batch is made is checked here (the
body's shape, each `custom_id`'s form and uniqueness, `params` an object, the count); each request's `params` are
checked by the runner like any line, and a bad one is answered `errored`."""

from __future__ import annotations

import re
from typing import Any

from ..api import strict_json
from ..api.errors import APIError, invalid_request

CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_OUTSIDE = re.compile(rb'["{}\[\]]')  # what changes the nesting outside a string
_IN_STRING = re.compile(rb'["\\]')
_NOT_SPACE = re.compile(rb"[^ \t\r\n]")
MESSAGES_URL = "/v1/messages"


def _too_large(index: int, limit: int) -> APIError:
    return APIError(f"requests[{index}] is larger than the {limit} bytes one request may have.", status=413,
                    type="invalid_request_error", code="request_too_large", param=f"requests[{index}]")


class RequestsScanner:
    """`feed(chunk)` -> the batch's input lines completed by it; `finish()` when the body has ended."""

    def __init__(self, max_line_bytes: int, max_requests: int) -> None:
        self.max_line_bytes = max_line_bytes
        self.max_requests = max_requests
        self.state = "start"  # start, key, colon, array, element, after_element, after_array, end
        self.buf = bytearray()  # the element or key being read
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.count = 0
        self.ids: set[str] = set()
        self.keys_seen = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        out: list[bytes] = []
        pos, n = 0, len(chunk)
        while pos < n:
            state = self.state
            if state == "element":
                pos = self._element(chunk, pos, out)
                continue
            if state == "key":
                end = chunk.find(b'"', pos)
                stop = n if end < 0 else end
                self.buf += chunk[pos:stop]
                if len(self.buf) > 64:
                    raise invalid_request("The body must be an object with one field, `requests`.")
                if end < 0:
                    return out
                key, self.buf = bytes(self.buf), bytearray()
                if key != b"requests" or self.keys_seen:
                    raise invalid_request(f"Unknown or repeated field {key.decode('utf-8', 'replace')!r}: the body "
                                          "has one field, `requests`.", param="requests")
                self.keys_seen += 1
                self.state = "colon"
                pos = end + 1
                continue
            match = _NOT_SPACE.search(chunk, pos)  # whitespace skipped in C: a body of spaces costs no loop
            if match is None:
                return out
            pos = match.start()
            byte = chunk[pos:pos + 1]
            pos += 1
            if state == "start" and byte == b"{":
                self.state = "open"
            elif state == "open" and byte == b'"':
                self.state = "key"
            elif state == "colon" and byte == b":":
                self.state = "value"
            elif state == "value" and byte == b"[":
                self.state = "array"
            elif state in ("array", "next") and byte == b"{":
                self.state, self.depth, self.buf = "element", 1, bytearray(b"{")
            elif state == "array" and byte == b"]" or state == "after_element" and byte == b"]":
                self.state = "after_array"
            elif state == "after_element" and byte == b",":
                self.state = "next"
            elif state == "after_array" and byte == b"}":
                self.state = "end"
            else:
                raise invalid_request(self._unexpected(byte), param="requests")
        return out

    def _unexpected(self, byte: bytes) -> str:
        if self.state in ("array", "next"):
            return f"requests[{self.count}] must be an object with `custom_id` and `params`."
        if self.state == "end":
            return "The body has text after its closing brace."
        return "The body must be a JSON object: {\"requests\": [{\"custom_id\": ..., \"params\": {...}}, ...]}."

    def _element(self, chunk: bytes, pos: int, out: list[bytes]) -> int:
        """Bytes of the current request from `pos` on, up to its end (then it is read) or the chunk's."""
        start, n = pos, len(chunk)
        while pos < n:
            if self.escaped:  # a backslash ended the previous chunk: this byte is what it escapes
                self.escaped = False
                pos += 1
                continue
            if self.in_string:
                match = _IN_STRING.search(chunk, pos)
                if match is None:
                    pos = n
                    break
                pos = match.end()
                if match.group() == b"\\":
                    if pos >= n:
                        self.escaped = True
                    else:
                        pos += 1  # the escaped byte, whatever it is
                else:
                    self.in_string = False
                continue
            match = _OUTSIDE.search(chunk, pos)
            if match is None:
                pos = n
                break
            pos = match.end()
            token = match.group()
            if token == b'"':
                self.in_string = True
            elif token in (b"{", b"["):
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth == 0:
                    self._take(chunk[start:pos], out)
                    self.state = "after_element"
                    return pos
        self._hold(chunk[start:pos])
        return pos

    def _hold(self, piece: bytes) -> None:
        self.buf += piece
        if len(self.buf) > self.max_line_bytes:
            raise _too_large(self.count, self.max_line_bytes)

    def _take(self, tail: bytes, out: list[bytes]) -> None:
        self._hold(tail)
        raw, self.buf = bytes(self.buf), bytearray()
        index = self.count
        self.count += 1
        if self.count > self.max_requests:
            raise invalid_request(f"A batch holds at most {self.max_requests} requests.", param="requests")
        out.append(self._line(index, raw))

    def _line(self, index: int, raw: bytes) -> bytes:
        try:
            request = strict_json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError, UnicodeDecodeError) as exc:
            raise invalid_request(f"requests[{index}] is not valid JSON: {exc}.", param=f"requests[{index}]") from None
        if not isinstance(request, dict) or set(request) - {"custom_id", "params"}:
            raise invalid_request(f"requests[{index}] must have `custom_id` and `params` and nothing else.",
                                  param=f"requests[{index}]")
        custom_id, params = request.get("custom_id"), request.get("params")
        if not isinstance(custom_id, str) or not CUSTOM_ID.match(custom_id):
            raise invalid_request(f"requests[{index}].custom_id must be 1 to 64 of a-z, A-Z, 0-9, _ and -.",
                                  param=f"requests[{index}].custom_id")
        if custom_id in self.ids:
            raise invalid_request(f"requests[{index}].custom_id {custom_id!r} is used by an earlier request: each "
                                  "must be unique in the batch.", param=f"requests[{index}].custom_id")
        self.ids.add(custom_id)
        if not isinstance(params, dict):
            raise invalid_request(f"requests[{index}].params must be an object (a Messages request).",
                                  param=f"requests[{index}].params")
        line: dict[str, Any] = {"custom_id": custom_id, "method": "POST", "url": MESSAGES_URL, "body": params}
        return strict_json.dumps_bytes(line) + b"\n"

    def finish(self) -> int:
        """The number of requests, once the body ended where it may."""
        if self.state != "end":
            raise invalid_request("The body ended before its end: it must be a JSON object "
                                  "{\"requests\": [...]}.", param="requests")
        if self.count == 0:
            raise invalid_request("`requests` must hold at least one request.", param="requests")
        return self.count
