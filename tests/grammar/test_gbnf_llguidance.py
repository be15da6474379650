"""Every client GBNF grammar we accept, llguidance builds a matcher for and computes a mask with.

Random grammars (repetitions with small, large, huge and reversed bounds, stacked; nested groups;
literals short and long, with escapes; character classes; `.`; tokens; alternates; rules calling
each other, left-recursively too) go through `client_gbnf` (our limits, then llguidance's converter and
compile); each one accepted becomes a matcher on the bundled model's vocabulary, which computes the first
token's mask. A refusal is a 400 naming `grammar`; a crash, an exception or a mask past the (generous)
budget is a failure.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.api.errors import APIError
from app.generation.plan import client_gbnf
from app.config.app_args import Limits
from app.engine.constraint import Constraint, GrammarRefused, grammar_tokenizer
from app.engine.llama import LlamaModelContext

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

TIME_BUDGET_S = 10.0  # compile + one mask, on a shared machine; llguidance's own limits keep it far lower

RULES = ("root", "r1", "r2")
CLASSES = ("[a-z]", "[^a-z]", "[ \\t\\n]", "[0-9a-fA-F]", "[^\"\\\\]", "[\\x00-\\x1F]", "[-a]", "[a-]", "[]", "[^]",
           "[\\]]", "[\\u0100-\\U0010FFFF]")
CHARS = 'ab "\\\n\t-€'
ESCAPES = ("\\x41", "\\u00e9", "\\U0001F600", "\\n", "\\\"", "\\\\")


class _Writer:
    """A grammar's text from one decision per draw (a recursive strategy draws far more: slow)."""

    def __init__(self, draw) -> None:
        self.draw = draw
        self.rules = 1 + self.pick(len(RULES))

    def pick(self, n: int) -> int:
        return self.draw(st.integers(0, n - 1))

    def count(self) -> int:
        kind = self.pick(24)
        if kind < 21:
            return self.pick(7)
        return self.draw((st.integers(0, 60), st.integers(0, 1000), st.sampled_from([2000, 2100, 10**6]))[kind - 21])

    def repetition(self) -> str:
        kind = self.pick(12)
        if kind < 6:
            return ""
        if kind < 9:
            return "*+?"[self.pick(3)]
        low = self.count()
        if kind == 9:
            return f"{{{low}}}"
        if kind == 10:
            return f"{{{low},}}"
        high = self.count() if self.pick(4) == 0 else low + self.count()  # reversed, now and then
        return f"{{ {low} , {high} }}" if self.pick(4) == 0 else f"{{{low},{high}}}"

    def literal(self) -> str:
        kind = self.pick(16)
        if kind == 0:
            return '"' + "x" * self.draw(st.integers(1, 60_000)) + '"'
        if kind == 1:
            return '""'
        body = []
        for _ in range(self.pick(5) + 1):
            if self.pick(4) == 0:
                body.append(ESCAPES[self.pick(len(ESCAPES))])
            else:
                body.append({'"': '\\"', "\\": "\\\\", "\n": "\\n"}.get(ch := CHARS[self.pick(len(CHARS))], ch))
        return '"' + "".join(body) + '"'

    def item(self, depth: int) -> str:
        kind = self.pick(10 if depth else 8)
        if kind < 3:
            text = self.literal()
        elif kind == 3:
            text = CLASSES[self.pick(len(CLASSES))]
        elif kind == 4:
            text = "."
        elif kind == 5:
            text = RULES[self.pick(self.rules)]
        elif kind == 6:
            text = ("<[1]>", "!<[2]>", "<[49151]>")[self.pick(3)]
        elif kind == 7:
            text = CLASSES[0]
        else:
            text = "(" + self.alternates(depth - 1) + ")"
        return text + self.repetition() + (self.repetition() if self.pick(6) == 0 else "")

    def alternates(self, depth: int) -> str:
        return " | ".join(" ".join(self.item(depth) for _ in range(self.pick(4) + (self.pick(8) > 0)))
                          for _ in range(self.pick(3) + 1))


@st.composite
def grammars(draw) -> str:
    writer = _Writer(draw)
    return "".join(f"{name} ::= {writer.alternates(3)}\n" for name in RULES[:writer.rules])


@pytest.fixture(scope="module")
def vocab(bundled_spec):
    llama = LlamaModelContext(bundled_spec.path, n_ctx_per_seq=64, n_seq_max=1, n_batch=64, n_threads=1,
                              n_threads_batch=1, n_gpu_layers=0, kv_unified=True)
    yield grammar_tokenizer(llama.vocab), llama.n_vocab
    llama.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow, HealthCheck.data_too_large])
@given(grammar=grammars())
def test_llguidance_builds_every_grammar_we_accept(vocab, grammar):
    tokenizer, n_vocab = vocab
    started = time.monotonic()
    try:
        converted = client_gbnf(grammar, Limits())
    except APIError as exc:
        assert exc.status == 400 and exc.param == "grammar" and exc.code, exc
        return
    try:
        Constraint(tokenizer, converted, n_vocab)  # compiles and computes the first mask
    except GrammarRefused as exc:  # the engine's 400: no token can start it (`root ::= root`)
        assert exc.unsatisfiable, exc
    assert time.monotonic() - started < TIME_BUDGET_S, grammar[:500]
