"""Validate a Responses stream event against its own schema in OpenAI's spec (the one its `type` names),
so a failure says what is wrong rather than which of 50 event schemas came closest."""

from __future__ import annotations

import functools
from typing import Any

from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from tests.support.openapi_spec import _load, assert_valid

_SDK_EVENT = TypeAdapter(ResponseStreamEvent)


@functools.cache
def event_schemas() -> dict[str, str]:
    """Event type -> its schema's name, from the members of `ResponseStreamEvent`."""
    doc, _ = _load()
    schemas = doc["components"]["schemas"]
    out = {}
    for member in schemas["ResponseStreamEvent"]["anyOf"]:
        name = member["$ref"].rsplit("/", 1)[1]
        for kind in schemas[name]["properties"]["type"].get("enum", []):
            out[kind] = name
    return out


_UNION_CHECKED: set[str] = set()


def assert_valid_event(event: dict[str, Any]) -> None:
    """Valid as its own type in the spec and in the official SDK's models (which require some fields the
    spec leaves optional); the first of each type also as a member of the spec's union (slow: 50 schemas)."""
    assert event.get("type") in event_schemas(), f"unknown event type {event.get('type')!r}"
    assert_valid(event_schemas()[event["type"]], event)
    _SDK_EVENT.validate_python(event)
    if event["type"] not in _UNION_CHECKED:
        assert_valid("ResponseStreamEvent", event)
        _UNION_CHECKED.add(event["type"])
