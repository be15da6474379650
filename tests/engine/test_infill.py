"""Fill-in-the-middle prompts laid out by the engine (app/engine/infill.py), on the bundled model written with FIM
tokens in its metadata (tools/fim_gguf.py): the layout token by token as llama-server's `format_prompt_infill`
builds it, its cuts, client text that stays text, a model without FIM tokens refused naming it, and a generation
from the layout."""

from __future__ import annotations

import dataclasses

import pytest

from app.engine import GenerationRequest, LlamaEngine, SamplingParams
from app.engine.errors import EngineError
from app.engine.events import Finished, Started
from app.engine.params import InfillPrompt
from tests.support.events import EventBox
from tools.fim_gguf import FIM_TOKENS, cached_gguf

pytestmark = pytest.mark.model

PRE, SUF, MID, REP, SEP = (FIM_TOKENS[k] for k in ("fim_pre", "fim_suf", "fim_mid", "fim_rep", "fim_sep"))


@pytest.fixture(scope="module")
def fim_engine(bundled_spec):
    eng = LlamaEngine(dataclasses.replace(bundled_spec, id="fim", path=str(cached_gguf()), n_batch=64)).start()
    yield eng
    eng.close()


def text(eng, s: str) -> list[int]:
    return eng.llama.tokenize(s, add_special=False, parse_special=False)


def test_the_layout_is_llama_servers_token_by_token(fim_engine):
    infill = InfillPrompt(prefix="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n",
                          extra=(("util.py", "import math\n"), ("b.py", "x = 1\n")), prompt="return")
    got = fim_engine.infill_tokens(infill, 16)
    expected = [REP, *text(fim_engine, "myproject\n"),
                SEP, *text(fim_engine, "util.py\n"), *text(fim_engine, "import math\n"),
                SEP, *text(fim_engine, "b.py\n"), *text(fim_engine, "x = 1\n"),
                SEP, *text(fim_engine, "filename\n"),
                PRE, *text(fim_engine, infill.prefix), *fim_engine.llama.tokenize("return", False, True),
                SUF, *text(fim_engine, infill.suffix), MID]
    assert got == expected  # no BOS: this vocabulary adds none


def test_long_parts_are_cut_as_llama_server_cuts_them(fim_engine):
    # n_batch 64: the prefix keeps its last 48 tokens, the suffix its first 16 - 2 - len(prompt).
    prefix, suffix = " ".join(f"p{i}" for i in range(200)), " ".join(f"s{i}" for i in range(200))
    got = fim_engine.infill_tokens(InfillPrompt(prefix=prefix, suffix=suffix), 16)
    pre, suf = text(fim_engine, prefix), text(fim_engine, suffix)
    i, j = got.index(PRE), got.index(SUF)
    assert got[i + 1:j] == pre[-48:] and got[j + 1:-1] == suf[:14] and got[-1] == MID
    # The other files keep their end: the context (1024) less a batch and twice the completion's limit.
    extra = (("big.py", "y = 2\n" * 600),)
    got = fim_engine.infill_tokens(InfillPrompt(prefix="a", suffix="b", extra=extra), 100)
    before = got[:got.index(PRE)]
    assert len(before) == 1024 - 64 - 200 and before[-2:] == [SEP, *text(fim_engine, "filename\n")][-2:]


def test_client_text_that_spells_fim_tokens_stays_text(fim_engine):
    spelled = "<issue_start><issue_closed><file_sep>"
    got = fim_engine.infill_tokens(InfillPrompt(prefix=spelled, suffix=spelled, extra=(("f", spelled),)), 16)
    assert got.count(PRE) == got.count(SUF) == got.count(MID) == 1 and got.count(SEP) == 2
    # `prompt` is read for control tokens, as llama-server reads it
    got = fim_engine.infill_tokens(InfillPrompt(prefix="", suffix="", prompt="<issue_closed>"), 16)
    assert got.count(MID) == 2


def test_a_model_without_fim_tokens_is_refused_naming_it(engine):
    with pytest.raises(EngineError) as info:
        engine.infill_tokens(InfillPrompt(prefix="a", suffix="b"), 16)
    err = info.value
    assert err.subject == "model" and err.code == "fim_unsupported" and "smollm2" in err.message.lower()
    with pytest.raises(EngineError):
        engine.prepare(GenerationRequest(request_id="x", prompt="", infill=InfillPrompt("a", "b")), EventBox())


def test_a_generation_starts_from_the_layout(fim_engine):
    infill = InfillPrompt(prefix="def add(a, b):\n    return ", suffix="\n")
    box = EventBox()
    req = GenerationRequest(request_id="i", prompt="", infill=infill, max_tokens=8,
                            sampling=SamplingParams(temperature=0), cache_prompt=False)
    fim_engine.submit(fim_engine.prepare(req, box))
    assert box.wait(60), box.events
    started = next(e for e in box.events if isinstance(e, Started))
    assert started.prompt_tokens == len(fim_engine.infill_tokens(infill, 8))
    assert next(e for e in box.events if isinstance(e, Finished)).completion_tokens >= 1
