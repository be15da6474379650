"""Pick a repository's GGUF by quantization tag (llama-server's `-hf <org>/<repo>:Q4_K_M`): the tag is
matched case-insensitively against the tag found in each file name; multimodal projectors (mmproj) and
later parts of a split are never candidates."""

from __future__ import annotations

import re

from .splits import is_later_part

# A quantization tag in a file name: Q4_K_M, IQ2_XXS, Q8_0, TQ1_0, F16, BF16, MXFP4_MOE... between
# separators (the word before it may end in `_`, as in model_Q4_K_M.gguf).
_TAG = re.compile(r"(?:^|[-._/])((?:I?Q|TQ)\d+(?:_[A-Z0-9]+)*|B?F16|F32|MXFP4(?:_MOE)?)(?=\.gguf$|[-./])", re.I)


class QuantError(ValueError):
    """No file, or more than one, has the asked tag; the message lists the tags there are."""


def quant_tag(filename: str) -> str | None:
    """The quantization tag of a GGUF file name (upper case), None if it shows none."""
    found = _TAG.findall(filename)
    return found[-1].upper() if found else None


def _candidates(files: list[str]) -> list[str]:
    return [f for f in files if f.lower().endswith(".gguf") and not f.rsplit("/", 1)[-1].lower().startswith("mmproj")
            and not is_later_part(f.rsplit("/", 1)[-1])]


def pick_quant(repo: str, files: list[str], quant: str) -> str:
    """The one GGUF of `files` whose tag is `quant` (for a split model: its first part)."""
    candidates = _candidates(files)
    matches = [f for f in candidates if (quant_tag(f) or "") == quant.upper()]
    if len(matches) == 1:
        return matches[0]
    tags = sorted({t for f in candidates if (t := quant_tag(f))})
    listed = ", ".join(tags) if tags else "none (the repo has no GGUF file with a quantization tag)"
    if not matches:
        raise QuantError(f"{repo} has no GGUF quantized as {quant!r}; available: {listed}")
    raise QuantError(f"{repo} has {len(matches)} GGUF files quantized as {quant!r} ({', '.join(matches)}): "
                     f"name one with hf://{repo}/<file.gguf>")

