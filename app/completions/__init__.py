"""Legacy text completions (`POST /v1/completions`): the prompt as it is, no chat template; one or
more prompts, n choices each, `echo`, legacy `logprobs`. Planning limits, sampling, deadlines and
metrics are the chat route's own pieces (app/chat/)."""

from .service import CompletionService

__all__ = ["CompletionService"]
