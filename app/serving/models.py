"""The models as the processing sees them: engines in this process, or model replicas behind Ray handles.
One interface for both, so planning, rounds and tokenization never know which topology serves them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ..engine.events import Event
from ..engine.params import EmbeddingJob, EmbeddingResult, GenerationRequest, ImageInput, RerankJob, RerankResult

State = Literal["ready", "loading", "downloading", "failed", "unavailable"]
# States that /health and requests report as a failure, with their reason.
FAILING: frozenset[str] = frozenset({"failed", "unavailable"})


@dataclass(frozen=True)
class ModelState:
    """Whether a model can serve now. `ready`: it answers requests (a model scaled to zero is ready: the
    first request waits for a replica); `loading`: it will, once a replica has loaded it; `downloading`:
    a replica is fetching its file (`reason`: the progress); `failed`: fetching it failed (`reason`: why,
    and whether it is tried again); `unavailable`: it cannot, for `reason` (a model llama.cpp cannot run
    here, no node can hold it)."""

    state: State
    reason: str | None = None

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def failing(self) -> bool:
        return self.state in FAILING


READY = ModelState("ready")
LOADING = ModelState("loading")


class Models(Protocol):
    """Every configured model, by id."""

    def open_stream(self, model_id: str, request: GenerationRequest) -> AsyncIterator[list[Event]]:
        """The generation's event batches; a failure is raised as an APIError (Ray's own failures mapped)."""

    async def embed(self, model_id: str, job: EmbeddingJob | RerankJob) -> EmbeddingResult | RerankResult:
        """An embedding model's vectors for the job's inputs, or a reranker's scores for a RerankJob's pairs
        (the same pooling engine); an APIError for bad input."""

    async def tokenize(self, model_id: str, text: str, add_special: bool) -> list[int]: ...

    async def count_prompt(self, model_id: str, prompt: str, images: list[ImageInput]) -> int:
        """A rendered chat prompt's tokens with its images' (what its generation's usage would say)."""

    async def detokenize(self, model_id: str, tokens: list[int]) -> str: ...

    async def stats(self, model_id: str) -> dict[str, Any]:
        """The engine's counters (running, waiting, slots, steps...) of one replica of the model."""

    def close(self) -> None: ...
