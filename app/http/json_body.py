"""The JSON response every route answers with: Starlette's, written by the server's one strict serialiser
(app/api/strict_json.py), so a body is always JSON a client can parse."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from ..api import strict_json


class JSONBody(JSONResponse):
    def render(self, content: Any) -> bytes:
        return strict_json.dumps_bytes(content)
