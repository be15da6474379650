"""What the store keeps of a file and of a batch (their records, as JSON), where (the layout of store.py), and how
each protocol shows them: OpenAI's `file` and `batch` objects, Anthropic's `message_batch`."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

# -- where things are --------------------------------------------------------------------------------------------


def files_dir(owner: str) -> str:
    return f"keys/{owner}/files"


def file_record_path(owner: str, file_id: str) -> str:
    return f"{files_dir(owner)}/{file_id}.json"


def file_data_path(owner: str, file_id: str) -> str:
    return f"{files_dir(owner)}/{file_id}.data"


def batches_dir(owner: str) -> str:
    return f"keys/{owner}/batches"


def batch_dir(owner: str, batch_id: str) -> str:
    return f"{batches_dir(owner)}/{batch_id}"


def batch_record_path(owner: str, batch_id: str) -> str:
    return f"{batch_dir(owner, batch_id)}/record.json"


def open_marker(owner: str, batch_id: str) -> str:
    return f"open/{owner}.{batch_id}"


def id_owner_path(any_id: str) -> str:
    return f"ids/{any_id}"


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


# -- files ----------------------------------------------------------------------------------------------------------

@dataclass
class FileRecord:
    id: str
    owner: str
    bytes: int
    created_at: int
    filename: str
    purpose: str  # batch (uploaded), batch_output (a batch's output or error file)

    def to_json(self) -> bytes:
        return _dumps(asdict(self))

    @classmethod
    def from_json(cls, blob: bytes) -> "FileRecord":
        data = json.loads(blob)
        return cls(**{f.name: data[f.name] for f in fields(cls)})

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed"}


# -- batches --------------------------------------------------------------------------------------------------------

OPEN = ("validating", "in_progress", "finalizing", "cancelling")
ENDED = ("completed", "failed", "expired", "cancelled")
# The line outcomes a batch counts (results.py): answered (a 2xx), errored (any other answer, or a line the runner
# gave up on), and lines never run because the batch was cancelled or its window ended.
OUTCOMES = ("succeeded", "errored", "cancelled", "expired")


@dataclass
class BatchRecord:
    id: str
    owner: str
    protocol: str  # "openai" or "anthropic"
    endpoint: str
    created_at: float
    expires_at: float
    input_file_id: str | None = None  # OpenAI's; a Message Batch keeps its requests in its own folder
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None
    status: str = "validating"
    model: str | None = None
    total: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    usage: dict[str, int] = field(default_factory=lambda: {"input_tokens": 0, "cached_tokens": 0,
                                                            "output_tokens": 0})
    errors: list[dict[str, Any]] = field(default_factory=list)
    output_file_id: str | None = None
    error_file_id: str | None = None
    # When each status began (unix seconds): in_progress, finalizing, completed, failed, expired, cancelling,
    # cancelled.
    times: dict[str, float] = field(default_factory=dict)
    ending: str | None = None  # while finalizing: the status it ends in (completed, cancelled, expired)
    # Whose lines run: the key's hash (its policy is looked up again while the batch runs, so a key taken out of
    # the keys file stops its batches) and the policy it had when the batch was made.
    key_sha256: str | None = None
    policy: dict[str, Any] | None = None

    def to_json(self) -> bytes:
        return _dumps(asdict(self))

    @classmethod
    def from_json(cls, blob: bytes) -> "BatchRecord":
        data = json.loads(blob)
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    @property
    def done(self) -> int:
        return sum(self.counts.values())

    def set_status(self, status: str, now: float | None = None) -> None:
        self.status = status
        self.times[status] = time.time() if now is None else now

    # -- OpenAI's `batch` ------------------------------------------------------------------------------------------
    def to_openai(self, cancel_asked: bool = False) -> dict[str, Any]:
        status = "cancelling" if cancel_asked and self.status in ("validating", "in_progress") else self.status
        at = {name: int(t) for name, t in self.times.items()}
        counts = self.counts
        body: dict[str, Any] = {
            "id": self.id, "object": "batch", "endpoint": self.endpoint, "model": self.model,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id, "completion_window": self.completion_window, "status": status,
            "output_file_id": self.output_file_id, "error_file_id": self.error_file_id,
            "created_at": int(self.created_at), "in_progress_at": at.get("in_progress"),
            "expires_at": int(self.expires_at), "finalizing_at": at.get("finalizing"),
            "completed_at": at.get("completed"), "failed_at": at.get("failed"), "expired_at": at.get("expired"),
            "cancelling_at": at.get("cancelling"), "cancelled_at": at.get("cancelled"),
            "request_counts": {"total": self.total, "completed": counts["succeeded"],
                               "failed": counts["errored"] + counts["cancelled"] + counts["expired"]},
            "usage": {"input_tokens": self.usage["input_tokens"],
                      "input_tokens_details": {"cached_tokens": self.usage["cached_tokens"]},
                      "output_tokens": self.usage["output_tokens"],
                      "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": self.usage["input_tokens"] + self.usage["output_tokens"]},
            "metadata": self.metadata,
        }
        # OpenAI's spec has none of these nullable (the SDK reads an absent one as None): absent until known.
        return {k: v for k, v in body.items() if v is not None or k == "metadata"}

    # -- Anthropic's `message_batch` -----------------------------------------------------------------------------
    def to_anthropic(self, cancel_asked: bool = False) -> dict[str, Any]:
        if self.ended:
            state = "ended"
        elif self.status == "cancelling" or cancel_asked:
            state = "canceling"
        else:
            state = "in_progress"
        counts = self.counts
        ended_at = next((self.times[s] for s in ENDED if s in self.times), None)
        cancel_at = self.times.get("cancelling")
        return {
            "id": self.id, "type": "message_batch", "processing_status": state,
            "request_counts": {"processing": max(0, self.total - self.done), "succeeded": counts["succeeded"],
                               "errored": counts["errored"], "canceled": counts["cancelled"],
                               "expired": counts["expired"]},
            "ended_at": rfc3339(ended_at) if state == "ended" else None,
            "created_at": rfc3339(self.created_at), "expires_at": rfc3339(self.expires_at),
            "cancel_initiated_at": rfc3339(cancel_at) if cancel_at is not None else None,
            "archived_at": None,
            # A path: the SDK joins it to its base URL, wherever the server is mounted.
            "results_url": f"/v1/messages/batches/{self.id}/results" if state == "ended" else None,
        }


def rfc3339(t: float) -> str:
    """Anthropic's times: RFC 3339, UTC."""
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat().replace("+00:00", "Z")
