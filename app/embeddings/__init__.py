"""/v1/embeddings: requests to an embedding model's engine, vectors shaped as OpenAI's list of embeddings."""

from .service import EmbeddingService

__all__ = ["EmbeddingService"]
