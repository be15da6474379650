"""Chat completions as an adapter of the generation core (app/generation/core.py): the core's reading of a
turn shaped as OpenAI's `chat.completion` and its chunks (responses.py). See docs/architecture.md."""

from .service import ChatService

__all__ = ["ChatService"]
