"""Streaming through a deployment handle: items relayed as they come, Ray's failures turned into
OpenAI errors, and the remote generator cancelled when the caller stops (client gone, deadline)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from .error_mapping import Refused, to_api_error


async def relay(start: Callable[[], Any]) -> AsyncIterator[Any]:
    """`start()` makes the call, e.g. `lambda: handle.options(stream=True).method.remote(...)`. It runs
    inside the mapping, so a failure while the call is placed (back-pressure, no replica) becomes the
    same OpenAI error as one raised while the items come."""
    response = None
    try:
        response = start()
        async for item in response:
            if isinstance(item, Refused):  # the callee's refusal, sent as its last item (channels.served)
                raise item.error
            yield item
    except Exception as exc:  # noqa: BLE001 - every failure becomes an APIError
        raise to_api_error(exc) from None
    finally:
        if response is not None:
            response.cancel()
