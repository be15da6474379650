"""An engine error as the client gets it: engine tests assert the protocol's error (status, type, code,
param, message) that the edge makes of what the engine raised (app.api.errors.as_api_error)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from app.api.errors import as_api_error
from app.engine.errors import EngineError


@contextmanager
def client_error() -> Iterator[SimpleNamespace]:
    """Like `pytest.raises(EngineError)`; after the block, `.value` is the APIError the client would get
    and `.engine` the engine error itself."""
    box = SimpleNamespace(value=None, engine=None)
    with pytest.raises(EngineError) as info:
        yield box
    box.engine = info.value
    box.value = as_api_error(info.value)


async def mapped_stream(engine, request, interval_s: float = 0.0):
    """The engine's event batches for `request` (stream.generate_stream) with its errors mapped as the edge
    maps them (deployments/models.py LocalModels): for services wired straight to an engine in tests."""
    from app.engine.stream import generate_stream

    events = generate_stream(engine, request, interval_s)
    try:
        async for batch in events:
            yield batch
    except EngineError as exc:
        raise as_api_error(exc) from None
    finally:
        await events.aclose()
