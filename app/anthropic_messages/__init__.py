"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) over chat's pipeline: a request
mapping (mapping.py) and a reply shaper (shaping.py, events.py); errors in Anthropic's shape (errors.py)."""

from .count import MessageTokenCounter
from .schemas import CountTokensRequest, MessagesRequest
from .service import MessagesService

__all__ = ["CountTokensRequest", "MessageTokenCounter", "MessagesRequest", "MessagesService"]
