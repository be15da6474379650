"""/v1/rerank: a query scored against each document by a reranker (rank pooling), sorted by relevance."""

from .service import RerankService

__all__ = ["RerankService"]
