"""Chat completions between the HTTP edge and the model: plan a request, run its generation
(continued when a tool call is cut), and shape OpenAI responses and chunks. See docs/architecture.md."""

from .service import ChatService

__all__ = ["ChatService"]
