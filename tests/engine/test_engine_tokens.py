"""The engine's tokenizer for /tokenize and /detokenize: the ids a generation counts, and text back."""

from __future__ import annotations

import pytest

from app.engine import GenerationRequest
from app.prompt.chat_template import render_prompt
from tests.support.engine_errors import client_error

TEXT = "Plain text, with accents (héllo), CJK (日本語) and spaces  twice."


def test_tokenize_counts_what_a_generation_counts(engine, bundled_spec):
    prompt = render_prompt(bundled_spec.chat_template, [{"role": "user", "content": "hi <|im_end|> there"}],
                           mark_content=True)
    gen = engine.prepare(GenerationRequest(request_id="t", prompt=prompt, max_tokens=1), lambda ev: None)
    assert engine.tokenize(prompt) == gen.prompt
    # the user's control-token text stays text, as in generation: only the template's ends are control tokens
    end = engine.tokenize("<|im_end|>")[0]
    assert engine.tokenize(prompt).count(end) == prompt.count("<|im_end|>") - 1


def test_round_trip(engine):
    assert engine.detokenize(engine.tokenize(TEXT)) == TEXT
    assert engine.detokenize([]) == ""
    # control tokens are written out
    ids = engine.tokenize("<|im_start|>user")
    assert len(ids) == 2 and engine.detokenize(ids) == "<|im_start|>user"


def test_add_special_false_never_adds_bos(engine):
    assert engine.tokenize(TEXT, add_special=False)[0] != engine.llama.bos or not engine.llama.add_bos


@pytest.mark.parametrize("bad", [-1, 49152, 2**40])
def test_out_of_vocabulary_is_a_400_naming_the_place(engine, bad):
    with client_error() as info:
        engine.detokenize([1, 2, bad])
    assert (info.value.status, info.value.param, info.value.code) == (400, "tokens[2]", "invalid_token")
