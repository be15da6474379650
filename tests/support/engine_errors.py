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
