"""A fill-in-the-middle prompt as token ids, laid out as llama-server lays out /infill (its `format_prompt_infill`),
from the vocabulary's own FIM tokens (the GGUF's `tokenizer.ggml.fim_*_token_id`, or the tokens llama.cpp
recognises by their text):

    [FIM_REP]myproject\\n [FIM_SEP]<filename>\\n<text> ... [FIM_SEP]filename\\n     the other files (input_extra)
    [BOS] [FIM_PRE]<prefix><prompt> [FIM_SUF]<suffix> [FIM_MID]

The repository part only where the vocabulary has a repository token, each file's separator only where it has a
file separator (else a `--- snippet ---` line between files, as llama-server writes), BOS only where the model
adds one. What does not fit is cut as llama-server cuts it: the prefix keeps its last 3/4 of a batch of tokens,
the suffix its first quarter less the prompt's, and the other files the end that fits the context less a batch
and twice the completion's limit (room kept for the completion: llama-server keeps twice its `n_predict`).

Client text is tokenized without special-token parsing, so a prefix that spells `<fim_middle>` stays text; only
`prompt` (what the completion starts with) is read for control tokens, as llama-server reads it.
"""

from __future__ import annotations

from typing import Any

from .errors import bad_input
from .params import InfillPrompt

SNIPPET = "\n\n--- snippet ---\n\n"  # between files where the vocabulary has no file separator (llama-server's)
REPOSITORY = "myproject\n"           # the repository's name llama-server writes
LAST_FILE = "filename\n"             # and the name it gives the file being completed


def fim_tokens(llama: Any) -> dict[str, int]:
    """The vocabulary's FIM tokens by role (pre, suf, mid, pad, rep, sep); -1 where it has none."""
    return llama.fim_tokens()


def infill_tokens(llama: Any, infill: InfillPrompt, *, model: str, n_batch: int, n_ctx: int,
                  n_predict: int | None) -> list[int]:
    """`infill`'s prompt for `llama`'s vocabulary; bad input naming the model when it has no FIM tokens.
    `n_predict`: the completion's limit (None: none, as llama-server's -1)."""
    fim = fim_tokens(llama)
    missing = [role for role, key in (("prefix", "pre"), ("suffix", "suf"), ("middle", "mid")) if fim[key] < 0]
    if missing:
        raise bad_input(f"Model `{model}` cannot fill in the middle: its vocabulary has no FIM "
                        f"{', '.join(missing)} token{'s' if len(missing) > 1 else ''} (tokenizer.ggml.fim_*_token_id). "
                        f"Use a code model trained for infilling.", "model", "fim_unsupported")

    def text(s: str) -> list[int]:
        return llama.tokenize(s, add_special=False, parse_special=False) if s else []

    extra: list[int] = []
    if fim["rep"] >= 0:
        extra += [fim["rep"], *text(REPOSITORY)]
    for filename, body in infill.extra:
        extra += [fim["sep"], *text(filename + "\n")] if fim["sep"] >= 0 else text(SNIPPET)
        extra += text(body)
    if fim["sep"] >= 0:
        extra += [fim["sep"], *text(LAST_FILE)]

    prefix, suffix = text(infill.prefix), text(infill.suffix)
    prompt = llama.tokenize(infill.prompt, add_special=False, parse_special=True) if infill.prompt else []
    quarter = n_batch // 4
    prefix_take = min(len(prefix), 3 * quarter)
    suffix_take = min(len(suffix), max(0, quarter - (2 + len(prompt))))
    predict = -1 if n_predict is None else n_predict
    extra_take = min(max(0, n_ctx - n_batch - 2 * predict), len(extra))

    head = [fim["pre"], *prefix[len(prefix) - prefix_take:], *prompt]
    if llama.add_bos:
        head.insert(0, llama.bos)
    return [*extra[len(extra) - extra_take:], *head, fim["suf"], *suffix[:suffix_take], fim["mid"]]
