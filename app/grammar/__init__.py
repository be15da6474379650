"""Grammars a request may carry: JSON schema -> GBNF (bounded), and client GBNF read as llama.cpp reads it,
then measured against the limits."""
