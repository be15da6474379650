"""Cache scopes: prompts of one scope share cached prefixes (slots, KV copies, the prompt cache), prompts
of different scopes never do, so `cached_tokens` only ever reflects the caller's own scope."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from app.engine import GenerationRequest, SamplingParams
from app.engine.events import Finished, Started, Text
from app.engine.prompt_cache import PromptCache
from app.engine.stream import generate_stream
from app.prompt.chat_template import render_prompt
from tests.support.events import run_until_idle

pytestmark = pytest.mark.timeout(300)

QUESTION = "Describe in detail a day in the life of a medieval blacksmith, from dawn to dusk, with his tools."
OTHER = "Explain step by step how a refrigerator works, covering the compressor, condenser and coils."


def _prompt(spec, text: str) -> str:
    return render_prompt(spec.chat_template, [{"role": "user", "content": text}])


async def _run(engine, prompt: str, scope: str, max_tokens: int = 6) -> tuple[Started, str, Finished]:
    req = GenerationRequest(request_id=uuid.uuid4().hex, prompt=prompt, max_tokens=max_tokens,
                            sampling=SamplingParams(temperature=0.0), cache_scope=scope)
    events = [ev async for batch in generate_stream(engine, req, 0) for ev in batch]
    start = next(ev for ev in events if isinstance(ev, Started))
    return start, "".join(ev.text for ev in events if isinstance(ev, Text)), events[-1]


def test_slots_are_reused_within_a_scope_only(engine, bundled_spec):
    prompt = _prompt(bundled_spec, QUESTION)
    a, b = f"a-{uuid.uuid4().hex}", f"b-{uuid.uuid4().hex}"

    async def scenario():
        first_a = await _run(engine, prompt, a)
        again_a = await _run(engine, prompt, a)
        first_b = await _run(engine, prompt, b)   # A's KV sits in a slot: never B's
        again_b = await _run(engine, prompt, b)
        return first_a, again_a, first_b, again_b

    (sa1, ta1, _), (sa2, _, ea2), (sb1, tb1, eb1), (sb2, _, _) = run_until_idle(engine, scenario())
    n = sa1.prompt_tokens
    assert sa1.cached_tokens == 0  # not even the template's header, cached by other scopes' prompts
    assert sa2.cached_tokens == n - 1 and ea2.cached_tokens == n - 1
    assert sb1.cached_tokens == 0 and eb1.cached_tokens == 0
    assert sb2.cached_tokens == n - 1  # B reuses its own
    assert ta1 == tb1  # both computed from scratch


def test_the_prompt_cache_restores_within_a_scope_only(bundled_spec):
    from app.engine import LlamaEngine
    from app.engine.stream import publish_to_loops

    engine = LlamaEngine(dataclasses.replace(bundled_spec, n_seq_max=1, prompt_cache_mib=64),
                         publish=publish_to_loops).start()
    p, q = _prompt(bundled_spec, QUESTION), _prompt(bundled_spec, OTHER)
    try:
        async def scenario():
            first = await _run(engine, p, "a")
            await _run(engine, q, "a")          # p's KV goes to the prompt cache, scope a
            other = await _run(engine, p, "b")  # the cache holds p, but for scope a only
            mine = await _run(engine, p, "a")   # restored (the slot now holds b's p)
            return first, other, mine, engine.stats()["prompt_cache"]

        (_, t1, _), (sb, tb, eb), (sa, _, _), stats = run_until_idle(engine, scenario())
    finally:
        engine.close()
    assert sb.cached_tokens == 0 and eb.cached_tokens == 0
    assert sa.cached_tokens == sa.prompt_tokens - 1
    assert stats["hits"] == 1
    assert t1 == tb  # both computed from scratch


def test_prompt_cache_entries_are_per_scope():
    tokens = list(range(100, 160))
    cache = PromptCache(max_bytes=1000, min_tokens=4)
    cache.put(tokens, "A", 10, "a")
    assert cache.best(tokens, "b") == (None, 0)
    assert cache.best(tokens, "a")[0].state == "A"
    # Covered in scope a, not in scope b: b's KV of the same tokens is worth keeping
    assert not cache.worth_keeping(tokens[:50], "a")
    assert cache.worth_keeping(tokens[:50], "b")
    # b's longer run does not replace a's entry
    cache.put(tokens + [7, 8], "B", 10, "b")
    assert cache.best(tokens, "a")[0].state == "A" and cache.best(tokens, "b")[0].state == "B"
    assert len(cache) == 2
