"""Streaming through a deployment handle: items relayed as they come, Ray's failures turned into
OpenAI errors, and the remote generator cancelled when the caller stops (client gone, deadline)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from .errors import to_api_error


async def relay(response: Any) -> AsyncIterator[Any]:
    """`response`: what `handle.options(stream=True).method.remote(...)` returned."""
    try:
        async for item in response:
            yield item
    except Exception as exc:  # noqa: BLE001 - every failure becomes an APIError
        raise to_api_error(exc) from None
    finally:
        response.cancel()


async def with_api_errors(events: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """`events` (a local async generator that calls handles) with Ray's failures as OpenAI errors."""
    try:
        async for item in events:
            yield item
    except Exception as exc:  # noqa: BLE001 - every failure becomes an APIError
        raise to_api_error(exc) from None
    finally:
        await events.aclose()
