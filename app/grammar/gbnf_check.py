"""Bounds on a GBNF grammar, checked before llama.cpp's parser sees it.

llama.cpp's GBNF parser recurses once per nested group, with no depth limit (60,000 nested
parentheses overflow the replica's stack), expands every repetition into copies of its item as it
parses (a reversed `{5,2}` wraps around to 2^64 copies: memory runs out), and builds a grammar whose
per-token work can grow without bound. Each would take the replica down, and a grammar is parsed
again for every choice. So the text is read here the way llama.cpp reads it (`gbnf_reader`, linear
time, no recursion) and what it would build is measured (`gbnf_cost`); past a limit the client gets
a 400 naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api.errors import APIError, invalid_request
from .gbnf_cost import GBNFCostError, grammar_cost
from .gbnf_reader import RULE_COST, GBNFBoundError, GBNFSyntaxError, line_col, read_gbnf

# llama.cpp's left-recursion check visits elements without building anything: measured, 1.6M
# visits (with the parse of a 250 KB grammar) take ~22 ms.
CHECK_WORK_PER_ELEMENT = 20


@dataclass(frozen=True)
class GBNFLimits:
    max_bytes: int = 64 * 1024
    max_depth: int = 64
    max_repetition: int = 1000
    max_elements: int = 500_000
    max_stacks: int | None = 64  # None: not checked
    # None: not checked, and `max_stacks` applies to the stacks entering each rule only (cheaper)
    max_ambiguity: int | None = 4
    # how messages name the elements and stacks limits (our schema grammars have their own)
    elements_setting: str = "limits.max_grammar_elements"
    stacks_setting: str = "limits.max_grammar_stacks"


def check_gbnf(text: str, limits: GBNFLimits, param: str = "grammar", subject: str | None = None) -> None:
    """A 400 (`param`) when `text` is over a limit or llama.cpp would refuse or choke on it.
    `subject` names the grammar in messages (default: the field)."""
    name = subject or f"`{param}`"

    def refuse(message: str, code: str) -> APIError:
        return invalid_request(f"{name} {message}", param=param, code=code)

    def at(pos: int) -> str:
        if pos < 0:
            return "the start"
        line, col = line_col(text, pos)
        return f"line {line}, column {col}"

    def after(pos: int) -> str:
        return "at the start" if pos < 0 else f"after the item at {at(pos)}"

    if not text:
        return  # no grammar
    if "\x00" in text:
        raise refuse("contains a NUL character.", "invalid_grammar")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise refuse("is not valid UTF-8 (it holds a lone surrogate).", "invalid_grammar") from None
    if size > limits.max_bytes:
        raise refuse(f"is {size} bytes; this server accepts grammars of at most {limits.max_bytes} bytes "
                     f"(limits.max_grammar_bytes).", "grammar_too_large")

    def too_deep(deepest: int) -> APIError:
        return refuse(f"nests groups {deepest} deep; at most {limits.max_depth} levels are accepted "
                      f"(limits.max_grammar_depth).", "grammar_too_complex")

    try:
        g = read_gbnf(text, max_repetition=limits.max_repetition, max_units=limits.max_elements)
    except GBNFSyntaxError as exc:
        if exc.deepest > limits.max_depth:
            raise too_deep(exc.deepest) from None
        raise refuse(f"is not valid GBNF as llama.cpp reads it: {exc} at {at(exc.pos)}.", "invalid_grammar") from None
    except GBNFBoundError as exc:
        if exc.deepest > limits.max_depth:
            raise too_deep(exc.deepest) from None
        written = exc.facts.get("written")
        if exc.kind == "repetition":
            raise refuse(f"repeats an item {written}; repetition bounds of at most {limits.max_repetition} "
                         f"are accepted (limits.max_schema_repetition).", "grammar_too_complex") from None
        if exc.kind == "reversed":
            raise refuse(f"repeats an item {written} at {at(exc.pos)}: the upper bound is below the lower "
                         f"one.", "invalid_grammar") from None
        raise refuse(f"expands to more than {limits.max_elements} grammar elements in llama.cpp (reached at "
                     f"{at(exc.pos)}): every repetition copies its item, and each rule a repetition or group "
                     f"generates counts as {RULE_COST} plus its rule name's length / 8; at most "
                     f"{limits.max_elements} are accepted ({limits.elements_setting}).",
                     "grammar_too_complex") from None
    if g.deepest > limits.max_depth:
        raise too_deep(g.deepest)
    try:
        cost = grammar_cost(g, steps=limits.max_ambiguity is not None)
    except GBNFCostError as exc:
        where = f"{exc.node.label} (at {at(exc.pos)})" if exc.node else at(exc.pos)
        if exc.kind == "left_recursion":
            raise refuse(f"is left-recursive: {where} can reach itself before reading a character, which "
                         f"llama.cpp's parser cannot follow.", "invalid_grammar") from None
        raise refuse(f"lets {where} call itself with a continuation that may be empty, so llama.cpp would "
                     f"keep one more parse stack for every repeat of it: its work per token would grow with "
                     f"the reply.", "grammar_too_complex") from None
    if cost.check_work > CHECK_WORK_PER_ELEMENT * limits.max_elements:
        raise refuse(f"makes llama.cpp's left-recursion check visit {cost.check_work} grammar elements (rules "
                     f"that may be empty, referenced many times over); at most {CHECK_WORK_PER_ELEMENT} x "
                     f"{limits.max_elements} are accepted ({CHECK_WORK_PER_ELEMENT} x {limits.elements_setting}).",
                     "grammar_too_complex")
    if limits.max_stacks is not None and cost.stacks > limits.max_stacks:
        where = f"entering the item at {at(cost.stacks_at)}" if cost.entering else after(cost.stacks_at)
        raise refuse(f"can leave llama.cpp {cost.stacks} parse stacks to follow at once ({where}); "
                     f"every one is checked against the whole vocabulary for each token, and at most "
                     f"{limits.max_stacks} are accepted ({limits.stacks_setting}). Each alternative and each "
                     f"optional item that can come next starts one; under a repetition, as in `x?{{0,n}}`, they "
                     f"multiply.", "grammar_too_complex")
    if limits.max_ambiguity is not None and cost.ambiguity > limits.max_ambiguity:
        raise refuse(f"can read one character in {cost.ambiguity} ways at once ({after(cost.ambiguity_at)}), and "
                     f"llama.cpp follows each way through every token that starts with it; at most "
                     f"{limits.max_ambiguity} are accepted (limits.max_grammar_ambiguity). Optional items "
                     f"that take the same characters, one after another or repeated (`\" \"?{{0,n}}`), add up; "
                     f"different literals do not.", "grammar_too_complex")
