"""The batch routes' typed requests: what crosses from the Ingress to the processing (frozen values that pickle).
The JSON body of `POST /v1/batches` is checked here, strictly, like every route's; the others are made from the
path and query (the route table's `from_path` parsers, app/http/routes.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..api.errors import invalid_request
from ..api.schemas import parse_request


class CreateBatchRequest(BaseModel):
    """`POST /v1/batches`: OpenAI's fields (unknown ones ignored, as on every route)."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True, allow_inf_nan=False)

    input_file_id: str = Field(min_length=1, max_length=128)
    endpoint: str = Field(min_length=1, max_length=128)
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = None
    output_expires_after: dict[str, Any] | None = None  # accepted; output files here last as long as the batch

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            if len(value) > 16:
                raise ValueError("metadata holds at most 16 keys")
            for key, item in value.items():
                if len(key) > 64 or len(item) > 512:
                    raise ValueError("metadata keys have at most 64 characters, values at most 512")
        return value


def parse_create_batch(body: Any) -> CreateBatchRequest:
    return parse_request(CreateBatchRequest, body)


@dataclass(frozen=True)
class BatchRequest:
    """One batch by id: retrieve (`GET /v1/batches/{id}`; `anthropic`: `GET /v1/messages/batches/{id}`)."""

    batch_id: str
    anthropic: bool = False


@dataclass(frozen=True)
class CancelBatchRequest:
    batch_id: str
    anthropic: bool = False


@dataclass(frozen=True)
class DeleteBatchRequest:
    """Anthropic's `DELETE /v1/messages/batches/{id}` (an ended batch and its results)."""

    batch_id: str


@dataclass(frozen=True)
class ListBatchesRequest:
    """A page of the caller's batches, newest first: OpenAI's `after` and `limit`, Anthropic's `after_id`,
    `before_id` and `limit`. `anthropic`: which protocol's batches and shapes."""

    anthropic: bool = False
    after: str | None = None
    before: str | None = None
    limit: int = 20


@dataclass(frozen=True)
class CreateMessageBatchRequest:
    """`POST /v1/messages/batches`, its requests already written to the batch's folder by the Ingress as lines
    (app/batches/message_batches.py): the batch is made from them."""

    batch_id: str
    total: int


@dataclass(frozen=True)
class FileRequest:
    """`GET /v1/files/{id}`: a file's record."""

    file_id: str


@dataclass(frozen=True)
class DeleteFileRequest:
    file_id: str


@dataclass(frozen=True)
class ListFilesRequest:
    purpose: str | None = None
    limit: int = 10000
    order: str = "desc"
    after: str | None = None


def query_int(value: str | None, name: str, default: int, low: int, high: int) -> int:
    """A whole-number query parameter within [low, high], or a 400 naming it."""
    if value is None:
        return default
    if not value.isdigit() or not low <= int(value) <= high:
        raise invalid_request(f"`{name}` must be a whole number from {low} to {high}.", param=name)
    return int(value)
