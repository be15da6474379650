"""The llama.cpp engine: one context per replica, many sequences decoded together."""

from .params import GenerationRequest, SamplingParams
from .engine import LlamaEngine

__all__ = ["GenerationRequest", "LlamaEngine", "SamplingParams"]
