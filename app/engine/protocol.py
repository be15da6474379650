"""What a host calls on an engine: the `Engine` protocol, and the two kinds of engine behind it.

A model's `kind` picks its engine (factory.py): a chat model's generates (GenerationEngine: LlamaEngine, or
SyntheticEngine at a configured speed), an embedding model's or a reranker's pools (PoolingEngine:
EmbeddingEngine). Each runs one decode thread (decode_thread.py). Failures are engine errors (errors.py).
Every method may be called from any thread unless it says otherwise; `prepare` and `count_prompt` are CPU
work (tokenizing, grammars), so callers on an event loop run them in a thread (stream.py, embedder.embed).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # names only: the protocol loads no engine
    from ..config.spec import ModelSpec
    from .params import (EmbeddingJob, EmbeddingResult, GenerationRequest, ImageInput, InfillPrompt, RerankJob,
                         RerankResult)
    from .slots import Sink


@runtime_checkable
class Engine(Protocol):
    spec: ModelSpec
    broken: str | None  # why it stopped (None while it serves)

    def start(self) -> "Engine": ...

    def healthy(self) -> bool: ...

    def stats(self) -> dict[str, Any]: ...

    def close(self) -> None: ...

    def tokenize(self, text: str, add_special: bool = True) -> list[int]: ...

    def detokenize(self, tokens: list[int]) -> str: ...


@runtime_checkable
class GenerationEngine(Engine, Protocol):
    """Generates text: a request is prepared (checked, tokenized), submitted, and its events go to its sink."""

    n_ctx: int
    step_s: float  # a recent busy step's duration (streams pace their batches by it)

    @property
    def active(self) -> int: ...

    @property
    def waiting(self) -> int: ...

    def prepare(self, req: GenerationRequest, sink: Sink) -> Any: ...

    def discard(self, gen: Any) -> None: ...

    def submit(self, gen: Any) -> None: ...

    def cancel(self, request_id: str) -> None: ...

    def count_prompt(self, prompt: str, images: list[ImageInput]) -> int: ...

    def infill_tokens(self, infill: InfillPrompt, limit: int | None) -> list[int]: ...

    def load_adapter(self, name: str, path: str) -> Any: ...


@runtime_checkable
class PoolingEngine(Engine, Protocol):
    """Pools inputs into vectors (or a reranker's pairs into scores): a job is prepared, then submitted."""

    def prepare(self, job: EmbeddingJob | RerankJob) -> list[list[int]]: ...

    def submit(self, job: EmbeddingJob | RerankJob, tokens: list[list[int]]) -> "Future[EmbeddingResult | RerankResult]": ...
