"""Where stored responses live (`store: true`, the Responses API's default): kept so that
`previous_response_id` continues a conversation and `GET /v1/responses/{id}` returns it.

An entry is a JSON-able dict (the response object and what a follow-up turn needs); `owner` is the
caller's key id (app/serving/caller.py), and an entry is only ever returned to its owner.
"""

from __future__ import annotations

from typing import Any, Protocol


class ResponseStore(Protocol):
    async def put(self, owner: str | None, response_id: str, entry: dict[str, Any]) -> None: ...

    async def get(self, owner: str | None, response_id: str) -> dict[str, Any] | None:
        """The entry, or None: unknown, expired, or another owner's (indistinguishable on purpose)."""

    async def delete(self, owner: str | None, response_id: str) -> bool: ...


class MemoryResponseStore:
    """A process-local store (unit tests; placeholder until the bounded one lands)."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str | None, str], dict[str, Any]] = {}

    async def put(self, owner: str | None, response_id: str, entry: dict[str, Any]) -> None:
        self._entries[(owner, response_id)] = entry

    async def get(self, owner: str | None, response_id: str) -> dict[str, Any] | None:
        return self._entries.get((owner, response_id))

    async def delete(self, owner: str | None, response_id: str) -> bool:
        return self._entries.pop((owner, response_id), None) is not None
