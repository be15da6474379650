"""bench/kvcache.py's and bench/pool.py's pure parts: greedy replies judged equal, parted at a near-tie or parted
elsewhere; the agent workload's preambles of about the size asked, one per model."""

from __future__ import annotations

from app.engine.events import TokenLogprob
from bench.kvcache import compare
from bench.pool import CHARS_PER_TOKEN, model_ids, preamble


def lp(token: bytes, top: tuple[float, float]) -> TokenLogprob:
    return TokenLogprob(token, top[0], ((b"a", top[0]), (b"b", top[1])))


def test_replies_are_equal_parted_at_a_tie_or_parted():
    base = [lp(b"x", (-0.1, -3.0)), lp(b"y", (-0.6, -0.7))]
    assert compare(base, [lp(b"x", (-0.1, -3.0)), lp(b"y", (-0.6, -0.7))]) == {"verdict": "equal", "gap": None,
                                                                              "shift": 0.0}
    tie = compare(base, [lp(b"x", (-0.3, -3.0)), lp(b"z", (-0.6, -0.7))])  # 0.1 nats apart where they part
    assert tie["verdict"] == "tie" and abs(tie["gap"] - 0.1) < 1e-9 and abs(tie["shift"] - 0.2) < 1e-9
    assert compare(base, [lp(b"w", (-0.1, -3.0))])["verdict"] == "other"  # 2.9 nats apart


def test_each_model_has_a_preamble_of_its_own_of_about_the_size_asked():
    texts = {m: preamble(m, 3000) for m in model_ids()}
    assert len(set(texts.values())) == len(texts)
    assert all(len(t) == int(3000 * CHARS_PER_TOKEN) for t in texts.values())  # sized by the tokenizer's rate
