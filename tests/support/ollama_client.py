"""The official `ollama` client against an app in this process (no server, no Ray): its async client over httpx's
ASGI transport, so its requests, its NDJSON reading and its errors (`ollama.ResponseError`) are its own."""

from __future__ import annotations

from typing import Any

import httpx
import ollama

BASE = "http://localhost:8000"  # a loopback Host: a server without keys answers it


def ollama_client(app: Any, key: str | None = None) -> ollama.AsyncClient:
    headers = {"Authorization": f"Bearer {key}"} if key else None
    return ollama.AsyncClient(host=BASE, transport=httpx.ASGITransport(app=app), headers=headers)


async def drain(parts: Any) -> list[Any]:
    """A streamed call's parts, in order."""
    return [part async for part in await parts]
