"""What the processing reports about each request, for metrics (and its span, when traced). app/ stays free of Ray:
deployments/metrics.py implements this with Ray's metrics, tests use a list."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class RequestRecord:
    model: str
    stream: bool
    status: str                 # "ok", "empty" (nothing but whitespace), "error", "cancelled", "timeout"
    error_code: str | None
    duration_s: float
    ttft_s: float | None        # request start -> first generated text
    itl_s: float | None         # mean gap between generated tokens after the first
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    protocol: str = "chat"      # the API that answered: "chat", "completions", "responses", "messages", "embeddings", "rerank"
    finish_reason: str | None = None  # the (first) choice's, when it finished
    adapter: str = ""           # the LoRA adapters it decoded under (names, comma-separated); "" the base model
    tenant: str = ""            # the name of the key it was sent with (app/tenants/policies.py); "" without keys
    batch: bool = False         # a line of a batch job (app/batches/), run at the lowest priority


class RequestObserver(Protocol):
    def record(self, rec: RequestRecord) -> None: ...


class NullObserver:
    def record(self, rec: RequestRecord) -> None:
        pass
