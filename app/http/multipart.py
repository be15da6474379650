"""A multipart/form-data body (what the SDKs send to upload a file) read as it arrives, by python-multipart's
streaming parser (the one Starlette's own form reading uses), without Starlette's spooling of whole files: the
file part's bytes are handed on as they come (to the store, app/http/batch_routes.py), the other fields kept
within small bounds. Header lines and counts are bounded by the parser; parts and field sizes here."""

from __future__ import annotations

from dataclasses import dataclass, field

from python_multipart.multipart import MultipartParser, parse_options_header
from python_multipart.exceptions import MultipartParseError

from ..api.errors import invalid_request

MAX_PARTS = 16
MAX_FIELD_BYTES = 1024


@dataclass
class FormEvents:
    """What one piece of the body completed: the file part's bytes (and its name when it began), fields ended."""

    file_data: list[bytes] = field(default_factory=list)
    filename: str | None = None
    fields: dict[str, str] = field(default_factory=dict)


class FormReader:
    """`feed(chunk)` -> FormEvents; `finish()` at the body's end. `file_field`: the part whose bytes are the file."""

    def __init__(self, content_type: str | None, file_field: str = "file") -> None:
        media, params = parse_options_header(content_type or "")
        boundary = params.get(b"boundary")
        if media != b"multipart/form-data" or not boundary:
            raise invalid_request("An upload is a multipart/form-data body with a boundary (a `file` part and a "
                                  "`purpose` field), as the SDKs send it.", param="file")
        self.file_field = file_field
        self.parts = 0
        self.file_parts = 0
        self._headers: dict[bytes, bytes] = {}
        self._field, self._value, self._data = b"", b"", b""  # a header's name and value; a field's value
        self._name: str | None = None
        self._is_file = False
        self._out = FormEvents()
        self.parser = MultipartParser(boundary, {
            "on_part_begin": self._part_begin, "on_header_field": self._header_field,
            "on_header_value": self._header_value, "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished, "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        })

    def feed(self, chunk: bytes) -> FormEvents:
        self._out = FormEvents()
        try:
            self.parser.write(chunk)
        except MultipartParseError as exc:
            raise invalid_request(f"The multipart body could not be read: {exc}.", param="file") from None
        return self._out

    def finish(self) -> None:
        try:
            self.parser.finalize()
        except MultipartParseError as exc:
            raise invalid_request(f"The multipart body could not be read: {exc}.", param="file") from None

    # -- the parser's callbacks --------------------------------------------------------------------------------------
    def _part_begin(self) -> None:
        self.parts += 1
        if self.parts > MAX_PARTS:
            raise invalid_request(f"The form has more than {MAX_PARTS} parts.", param="file")
        self._headers, self._field, self._value, self._data = {}, b"", b"", b""
        self._name, self._is_file = None, False

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _header_end(self) -> None:
        self._headers[self._field.lower()] = self._value
        self._field, self._value = b"", b""

    def _headers_finished(self) -> None:
        disposition, params = parse_options_header(self._headers.get(b"content-disposition", b""))
        if disposition != b"form-data" or b"name" not in params:
            raise invalid_request("Each part of the form needs `Content-Disposition: form-data; name=...`.",
                                  param="file")
        self._name = params[b"name"].decode("utf-8", "replace")
        self._is_file = self._name == self.file_field
        if self._is_file:
            self.file_parts += 1
            if self.file_parts > 1:
                raise invalid_request("The form holds more than one `file`.", param="file")
            self._out.filename = params.get(b"filename", b"").decode("utf-8", "replace")

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._is_file:
            self._out.file_data.append(bytes(data[start:end]))
            return
        self._data += data[start:end]
        if len(self._data) > MAX_FIELD_BYTES:
            raise invalid_request(f"Form field `{self._name}` is longer than {MAX_FIELD_BYTES} bytes.",
                                  param=self._name)

    def _part_end(self) -> None:
        if not self._is_file and self._name is not None:
            self._out.fields[self._name] = self._data.decode("utf-8", "replace")
        self._data = b""
