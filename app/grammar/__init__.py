"""Grammars a request may carry, as llguidance grammars: JSON schemas (bounded by our limits), forced tool
calls, clients' GBNF through llguidance's converter."""
