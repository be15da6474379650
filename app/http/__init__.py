"""The HTTP edge: the Starlette app and its routes, API-key checks, SSE framing and keep-alive ticks."""
