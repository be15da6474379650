"""Chat completions between the HTTP edge and the model: run a planned request's generation (continued when
a tool call is cut), and shape OpenAI responses and chunks. Planning is app/generation/plan.py, shared with
the other protocols. See docs/architecture.md."""

from .service import ChatService

__all__ = ["ChatService"]
