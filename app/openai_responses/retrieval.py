"""GET and DELETE /v1/responses/{id}: a caller's stored response, returned or forgotten, in OpenAI's shapes.
Another caller's response, an expired one and one never stored all answer the same 404."""

from __future__ import annotations

from typing import Any

from ..api.errors import APIError, not_found
from ..generation.caller import Caller
from .schemas import DeleteResponseRequest, StoredResponseRequest
from .store import ResponseStore


def response_not_found(response_id: str) -> APIError:
    return not_found(f"Response with id '{response_id}' not found.")


class StoredResponses:
    """Reads and deletes over `store` (None: storing is off, so nothing is ever found)."""

    def __init__(self, store: ResponseStore | None) -> None:
        self.store = store

    async def get(self, request: StoredResponseRequest, caller: Caller) -> dict[str, Any]:
        """The response object as it was stored."""
        response_id = request.response_id
        entry = None if self.store is None else await self.store.get(caller.key_id, response_id)
        if entry is None:
            raise response_not_found(response_id)
        return entry["response"]

    async def delete(self, request: DeleteResponseRequest, caller: Caller) -> dict[str, Any]:
        response_id = request.response_id
        if self.store is None or not await self.store.delete(caller.key_id, response_id):
            raise response_not_found(response_id)
        return {"id": response_id, "object": "response", "deleted": True}
