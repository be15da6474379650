"""Ollama's API (/api/chat, /api/generate, /api/embed, /api/tags, /api/show, /api/ps, /api/version) over the same
pipeline as every protocol: request mappings (mapping.py, options.py), the generation core and the embeddings
service, Ollama's records and NDJSON stream (shaping.py; framed by app/http/ndjson.py), Ollama's error shape
(errors.py), model names as Ollama clients send them (names.py), `keep_alive` through the pools (keep_alive.py)."""

from .catalogue import OllamaCatalogue
from .embed import OllamaEmbedService
from .schemas import (
    OllamaChatRequest, OllamaEmbeddingsRequest, OllamaEmbedRequest, OllamaGenerateRequest, OllamaPsRequest,
    OllamaShowRequest, OllamaTagsRequest, OllamaVersionRequest,
)
from .service import OllamaService

__all__ = ["OllamaCatalogue", "OllamaChatRequest", "OllamaEmbedRequest", "OllamaEmbedService",
           "OllamaEmbeddingsRequest", "OllamaGenerateRequest", "OllamaPsRequest", "OllamaService",
           "OllamaShowRequest", "OllamaTagsRequest", "OllamaVersionRequest"]
