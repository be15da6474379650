"""A (query, document) pair as one reranker sequence, formatted as llama-server's `format_prompt_rerank` does.

With a `rerank` template in the GGUF (tokenizer.chat_template.rerank) the pair is that template with
`{query}` and `{document}` filled in. Without one it is built from the vocabulary's special tokens:
    [BOS] query [EOS] [SEP] document [EOS]
each present only where the vocabulary adds it (llama_vocab_get_add_bos/eos/sep), EOS falling back to SEP
where the model has none. A BERT cross-encoder gets [CLS] q [SEP] d [SEP]; a RoBERTa one <s> q </s></s> d </s>.

One difference from llama-server, on purpose: client text is tokenized without special-token parsing (a
document that says "[SEP]" cannot end the query early), so a template's own text and the client's are
tokenized as separate pieces rather than as one string.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

TOKEN_NULL = -1  # LLAMA_TOKEN_NULL: the model has no such token
_SLOTS = re.compile(r"(\{query\}|\{document\})")


@dataclass(frozen=True)
class PairVocab:
    bos: int
    eos: int
    sep: int
    add_bos: bool
    add_eos: bool
    add_sep: bool
    template: str | None = None  # the GGUF's `rerank` chat template


@dataclass(frozen=True)
class Pair:
    """A formatted pair's tokens, and where its document's tokens are (`start`, `end`): truncation cuts there."""

    tokens: list[int]
    start: int
    end: int

    def truncated(self, limit: int) -> "Pair | None":
        """The pair in at most `limit` tokens, the document's last tokens cut; None if even an empty document
        would not fit."""
        over = len(self.tokens) - limit
        if over <= 0:
            return self
        if over > self.end - self.start:
            return None
        cut = self.end - over
        return Pair(self.tokens[:cut] + self.tokens[self.end:], self.start, cut)


# tokenize(text, parse_special) -> tokens, never adding BOS/EOS of its own.
Tokenize = Callable[[str, bool], list[int]]


def format_pair(vocab: PairVocab, tokenize: Tokenize, query: str, document: str) -> Pair:
    if vocab.template is not None:
        return _templated(vocab.template, tokenize, query, document)
    eos = vocab.eos if vocab.eos != TOKEN_NULL else vocab.sep
    tokens = [vocab.bos] if vocab.add_bos else []
    tokens += tokenize(query, False)
    if vocab.add_eos:
        tokens.append(eos)
    if vocab.add_sep:
        tokens.append(vocab.sep)
    start = len(tokens)
    tokens += tokenize(document, False)
    end = len(tokens)
    if vocab.add_eos:
        tokens.append(eos)
    return Pair(tokens, start, end)


def _templated(template: str, tokenize: Tokenize, query: str, document: str) -> Pair:
    """The template's own text with special-token parsing (its control tokens are the model's), the client's
    without. Every `{document}` is filled; truncation cuts the last one."""
    tokens: list[int] = []
    start = end = 0
    for piece in _SLOTS.split(template):
        if piece == "{query}":
            tokens += tokenize(query, False)
        elif piece == "{document}":
            start = len(tokens)
            tokens += tokenize(document, False)
            end = len(tokens)
        elif piece:
            tokens += tokenize(piece, True)
    return Pair(tokens, start, end)
