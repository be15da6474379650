"""Grammars as the engine takes them (llguidance's), from the GBNF a client would send."""

from __future__ import annotations

from app.grammar.llguidance_grammars import from_gbnf


def gbnf(text: str) -> str:
    return from_gbnf(text, max_depth=64, max_repetition=1000)
