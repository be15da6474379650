"""Greedy replies compared up to near-ties. A batch's composition (other sequences beside it, drafts verified in
it, adapters decoded in their own steps) changes llama.cpp's sums in the last bits, so two greedy replies to one
prompt may part ways where the model's top two tokens are nearly tied, and nowhere else. TIE_NATS is the gap
measured and stated in tests/engine/test_engine_speculation.py, which uses it too."""

from __future__ import annotations

from typing import Any

TIE_NATS = 0.25


def same_up_to_a_tie(base: list[dict[str, Any]], other: list[dict[str, Any]]) -> bool:
    """True where two OpenAI `logprobs.content` lists (top_logprobs of 2 or more) have the same tokens; where
    they part, the baseline's top two at the first differing position must be within TIE_NATS (asserted),
    and then False."""
    if [t["token"] for t in base] == [t["token"] for t in other]:
        return True
    i = next(i for i, (x, y) in enumerate(zip(base, other)) if x["token"] != y["token"])  # not one's prefix
    top = base[i]["top_logprobs"]
    assert len(top) >= 2 and top[0]["logprob"] - top[1]["logprob"] < TIE_NATS, (i, base[i], other[i])
    return False


def parted_at_a_tie(base: Any, other: Any) -> bool:
    """`same_up_to_a_tie` for two engine replies (tests/support/events.py EventBox, logprobs of 2 asked): True where
    they are equal; where they part, the baseline's top two tokens at the first differing position must be within
    TIE_NATS (asserted), and then False."""
    a, b = base.logprobs, other.logprobs
    if [lp.token for lp in a] == [lp.token for lp in b]:
        assert base.text == other.text and base.last.finish_reason == other.last.finish_reason
        return True
    i = next(i for i, (x, y) in enumerate(zip(a, b)) if x.token != y.token)
    top = a[i].top
    assert len(top) == 2 and top[0][1] - top[1][1] < TIE_NATS, (i, a[i], b[i], base.text, other.text)
    return False
