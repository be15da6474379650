"""The models as the processing sees them: engines in this process, or model replicas behind Ray handles.
One interface for both, so planning, rounds and tokenization never know which topology serves them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from ..engine.events import Event
from ..engine.params import GenerationRequest, Job

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

R = TypeVar("R")


class Models(Protocol):
    """Every configured model, by id, behind two verbs (as vLLM's EngineClient has generate/encode): a
    generation streams its events; anything else is a job (app/engine/params.py Job: embeddings, scores,
    tokens, counts, stats) answered once. A new kind of job needs no change here nor in the classes that
    forward these two calls (TracedModels, LocalModels, RemoteModels, the model and pool deployments): only a
    job type and its handler in EngineHost."""

    def generate(self, model_id: str, request: GenerationRequest) -> AsyncIterator[list[Event]]:
        """The generation's event batches; a failure is raised as an APIError (Ray's own failures mapped)."""

    async def run(self, model_id: str, job: Job[R]) -> R:
        """The job's result from one replica of the model; a failure is raised as an APIError (a job the model
        does not serve, e.g. an embedding for a chat model, is a 400)."""

    def close(self) -> None: ...
