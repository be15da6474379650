"""The small jobs a model's replica answers besides generations and pooling (EmbeddingJob, RerankJob in
params.py): each a value saying what is asked, typed by the result it returns. They cross the Ray hop as
they are; `Models.run(model_id, job)` carries any of them, and EngineHost answers each by its type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .params import ImageInput, InfillPrompt, Job


@dataclass(frozen=True)
class TokenizeJob(Job[list[int]]):
    """`text`'s token ids as a prompt is tokenized (content marks honoured); `add_special`: the model's BOS."""

    text: str
    add_special: bool = True


@dataclass(frozen=True)
class DetokenizeJob(Job[str]):
    """The text of token ids; an id outside the vocabulary is a 400 naming its place."""

    tokens: list[int]


@dataclass(frozen=True)
class CountPromptJob(Job[int]):
    """A rendered chat prompt's tokens with its images' positions (what its generation's usage would say); a
    chat model's only."""

    prompt: str
    images: list[ImageInput]


@dataclass(frozen=True)
class InfillTokensJob(Job[list[int]]):
    """A fill-in-the-middle prompt's token ids as a generation of at most `max_tokens` would have them (laid out
    from the vocabulary's FIM tokens, app/engine/infill.py); a chat model's only."""

    infill: InfillPrompt
    max_tokens: int | None = None


@dataclass(frozen=True)
class StatsJob(Job[dict[str, Any]]):
    """The engine's counters (running, waiting, slots, steps...) of the replica that answers; a pooled model
    that is not loaded answers its pool state without being loaded."""
