"""The llama.cpp engine: one context per replica, many sequences decoded together.

The engines themselves (llama.cpp, its bindings) load on first use (`app.engine.LlamaEngine`), so the
request types and engine errors here cost no more than their own modules to those that only name them."""

from typing import Any

from .params import GenerationRequest, SamplingParams

__all__ = ["GenerationRequest", "LlamaEngine", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "LlamaEngine":
        from .engine import LlamaEngine

        return LlamaEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
