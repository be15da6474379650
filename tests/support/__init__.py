"""Helpers the tests share: OpenAI spec validation, a real local Ray Serve, engine event capture."""
