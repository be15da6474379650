"""`/tokenize` and `/detokenize` (vLLM's shapes), and a rendered prompt counted as its generation's usage
counts it (the Responses and Messages token-count routes)."""

from .service import ModelTokens, TokenService, prompt_count

__all__ = ["ModelTokens", "TokenService", "prompt_count"]
