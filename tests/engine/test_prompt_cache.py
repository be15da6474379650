"""The prompt cache in host memory (app/engine/prompt_cache.py): its bookkeeping as plain data, then
the real engine with one slot, where a prompt that comes back after its slot served another one is
restored from the cache instead of prefilled again, with the same greedy reply."""

from __future__ import annotations

import dataclasses
import time
import uuid

import numpy as np
import pytest

from app.engine import GenerationRequest, SamplingParams
from app.engine.events import Finished, Started, Text
from app.engine.prompt_cache import PromptCache
from app.kvstore.token_table import TokenTable
from app.engine.stream import generate_stream
from tests.support.events import run_until_idle


def tokens(*runs: tuple[int, int]) -> list[int]:
    """Concatenated ranges: tokens((0, 40), (100, 10)) is 0..39 then 100..109."""
    return [t for start, n in runs for t in range(start, start + n)]


def test_shared_prefix():
    a = np.array([1, 2, 3, 4], dtype=np.int32)
    table = TokenTable()
    table.add(0, a)
    assert list(table.shared(np.array([1, 2, 9], dtype=np.int32))) == [2]
    assert list(table.shared(a[:3])) == [3]
    assert list(table.shared(np.array([], dtype=np.int32))) == [0]


def test_best_entry_is_the_longest_shared_prefix():
    cache = PromptCache(max_bytes=1000, min_tokens=4)
    cache.put(tokens((0, 40), (100, 10)), "A", 10, "")
    cache.put(tokens((0, 40), (200, 10)), "B", 10, "")
    entry, n = cache.best(tokens((0, 40), (200, 5), (900, 3)), "")
    assert entry.state == "B" and n == 45
    assert cache.best(tokens((500, 10)), "") == (None, 0)


def test_short_or_covered_runs_are_not_kept():
    cache = PromptCache(max_bytes=1000, min_tokens=32)
    assert not cache.worth_keeping(tokens((0, 31)), "")
    assert cache.worth_keeping(tokens((0, 60)), "")
    cache.put(tokens((0, 60)), "A", 10, "")
    assert not cache.worth_keeping(tokens((0, 50)), "")  # an entry holds these and more
    assert cache.worth_keeping(tokens((0, 50), (300, 20)), "")
    assert not PromptCache(max_bytes=0).worth_keeping(tokens((0, 60)), "")


def test_a_longer_run_replaces_the_entry_it_extends():
    cache = PromptCache(max_bytes=1000, min_tokens=4)
    cache.put(tokens((0, 40)), "short", 10, "")
    cache.put(tokens((0, 80)), "long", 30, "")
    assert len(cache) == 1 and cache.bytes == 30
    assert cache.best(tokens((0, 40)), "")[0].state == "long"


def test_bounded_by_bytes_least_recently_used_out():
    cache = PromptCache(max_bytes=100, min_tokens=4)
    cache.put(tokens((1000, 10)), "A", 40, "")
    cache.put(tokens((2000, 10)), "B", 40, "")
    cache.best(tokens((1000, 10)), "")  # A used: B is now the oldest
    cache.put(tokens((3000, 10)), "C", 40, "")
    assert cache.bytes == 80 and len(cache) == 2
    assert cache.best(tokens((2000, 10)), "") == (None, 0)
    assert cache.best(tokens((1000, 10)), "")[0].state == "A"
    cache.put(tokens((4000, 10)), "too big", 101, "")  # larger than the whole cache: not stored
    assert cache.bytes == 80


# -- the real engine ------------------------------------------------------------------------------

QUESTIONS = [
    "Describe in detail a day in the life of a medieval blacksmith, from dawn to dusk, with his tools.",
    "Explain step by step how a refrigerator works, covering the compressor, condenser and coils.",
]


async def _run(engine, prompt: str) -> tuple[Started, str, Finished]:
    req = GenerationRequest(request_id=uuid.uuid4().hex, prompt=prompt, max_tokens=12, stop=[],
                            sampling=SamplingParams(temperature=0.0))
    events = [ev async for batch in generate_stream(engine, req, 0) for ev in batch]
    start = next(ev for ev in events if isinstance(ev, Started))
    return start, "".join(ev.text for ev in events if isinstance(ev, Text)), events[-1]


def _one_slot_engine(spec, cache_mib: float):
    from app.engine import LlamaEngine
    from app.engine.stream import publish_to_loops

    return LlamaEngine(dataclasses.replace(spec, n_seq_max=1, prompt_cache_mib=cache_mib),
                       publish=publish_to_loops).start()


def _a_b_a(spec, cache_mib: float):
    from app.prompt.chat_template import render_prompt

    a, b = (render_prompt(spec.chat_template, [{"role": "user", "content": q}]) for q in QUESTIONS)
    engine = _one_slot_engine(spec, cache_mib)
    try:
        async def scenario():
            first = await _run(engine, a)
            await _run(engine, b)  # takes the only slot: A's KV must go to the cache or be lost
            return first, await _run(engine, a), engine.stats()["prompt_cache"]
        return run_until_idle(engine, scenario())
    finally:
        engine.close()


@pytest.mark.timeout(300)
def test_a_prompt_back_after_its_slot_was_reused_is_restored(bundled_spec):
    (start1, text1, end1), (start2, text2, end2), stats = _a_b_a(bundled_spec, cache_mib=64)
    assert start1.cached_tokens < 30  # the template's header at most
    # Everything but the last prompt token came from the cache.
    assert start2.cached_tokens == start2.prompt_tokens - 1, start2
    assert stats["hits"] == 1 and stats["entries"] >= 1 and 0 < stats["bytes"] <= 64 << 20
    # The restored KV is the same computation: the greedy reply is the same.
    assert text2 == text1 and end2.completion_tokens == end1.completion_tokens


def test_clear_drops_every_entry():
    cache = PromptCache(max_bytes=100, min_tokens=4)
    cache.put(tokens((1000, 10)), "A", 40, "")
    cache.put(tokens((2000, 10)), "B", 40, "k")
    cache.clear()
    assert (cache.bytes, len(cache)) == (0, 0) and cache.best(tokens((1000, 10)), "") == (None, 0)
    cache.put(tokens((1000, 10)), "A", 40, "")  # still usable
    assert cache.best(tokens((1000, 10)), "")[0].state == "A"


@pytest.mark.timeout(300)
def test_a_closed_engine_lets_go_of_its_prompt_cache(bundled_spec):
    """A closed engine is freed only when Python's cycle collector finds it; a pool replica that reloads models
    kept every closed engine's cache until then (gigabytes), so close() empties it."""
    from app.prompt.chat_template import render_prompt

    a, b = (render_prompt(bundled_spec.chat_template, [{"role": "user", "content": q}]) for q in QUESTIONS)
    engine = _one_slot_engine(bundled_spec, 64)
    try:
        async def scenario():
            await _run(engine, a)
            await _run(engine, b)  # a's KV goes to the cache
        run_until_idle(engine, scenario())
        assert engine.placement.prompt_cache.bytes > 0
    finally:
        engine.close()
    assert engine.placement.prompt_cache.bytes == 0 and len(engine.placement.prompt_cache) == 0


@pytest.mark.timeout(300)
def test_without_the_cache_the_prompt_is_prefilled_again(bundled_spec):
    _, (start2, _, _), stats = _a_b_a(bundled_spec, cache_mib=0)
    assert start2.cached_tokens < 30
    assert stats == {"entries": 0, "bytes": 0, "hits": 0}


class NaiveCache:
    """The cache's rules entry by entry (what PromptCache did before its token tables): the reference."""

    def __init__(self, max_bytes: int, min_tokens: int) -> None:
        self.max_bytes, self.min_tokens, self.entries, self.bytes = max_bytes, min_tokens, [], 0

    def worth_keeping(self, toks: list[int], scope: str) -> bool:
        return len(toks) >= self.min_tokens and not any(
            s == scope and len(t) >= len(toks) and t[:len(toks)] == toks for t, _, _, s in self.entries)

    def put(self, toks: list[int], state: str, size: int, scope: str) -> None:
        if size > self.max_bytes:
            return
        self.entries = [e for e in self.entries if not (e[3] == scope and toks[:len(e[0])] == e[0])]
        self.bytes = sum(e[2] for e in self.entries)
        while self.entries and self.bytes + size > self.max_bytes:
            self.bytes -= self.entries.pop(0)[2]
        self.entries.append((toks, state, size, scope))
        self.bytes += size

    def best_len(self, prompt: list[int], scope: str) -> int:
        return max((next((i for i, (a, b) in enumerate(zip(t, prompt)) if a != b), min(len(t), len(prompt)))
                    for t, _, _, s in self.entries if s == scope), default=0)


def test_the_token_tables_agree_with_the_rules_entry_by_entry():
    """Random prompts over a few shared headers, two scopes, entries of every length up to 700 tokens (wider than
    a table's first rows), eviction by bytes: every lookup answers as the entry-by-entry rules do."""
    rng = np.random.default_rng(7)
    headers = [list(rng.integers(0, 50, n)) for n in (0, 20, 40)]
    cache, ref = PromptCache(max_bytes=3000, min_tokens=8), NaiveCache(3000, 8)
    for step in range(600):
        scope = ("", "other")[int(rng.integers(0, 2))]
        tail = rng.integers(0, 50, int(rng.integers(0, 660)))
        toks = [int(t) for t in headers[int(rng.integers(0, 3))] + list(tail)]
        if rng.random() < 0.4 and ref.entries:  # a prompt cutting one already stored, or extending its start
            base = ref.entries[int(rng.integers(0, len(ref.entries)))][0]
            extra = toks[:int(rng.integers(0, 50))] if rng.random() < 0.5 else []
            toks = base[:int(rng.integers(0, len(base) + 1))] + extra
        entry, n = cache.best(toks, scope)
        assert n == ref.best_len(toks, scope), step
        if n:  # the entry found is one sharing that many tokens; used, it goes last in line for eviction
            assert entry.scope == scope and list(entry.tokens[:n]) == toks[:n]
            ref.entries.append(ref.entries.pop(next(i for i, e in enumerate(ref.entries) if e[1] == entry.state)))
        assert cache.worth_keeping(toks, scope) == ref.worth_keeping(toks, scope), step
        if ref.worth_keeping(toks, scope):
            size = int(rng.integers(1, 400))
            cache.put(toks, f"s{step}", size, scope)
            ref.put(toks, f"s{step}", size, scope)
        assert [e.state for e in cache._entries.values()] == [e[1] for e in ref.entries], step
        assert cache.bytes == ref.bytes, step


def _no_end(engine) -> list[tuple[int, float]]:
    """A logit bias that keeps the model from ending its reply (every end-of-generation token out)."""
    import llama_cpp as L

    vocab = engine.llama.vocab
    return [(t, -100.0) for t in range(engine.llama.n_vocab) if L.llama_vocab_is_eog(vocab, t)]


def _wait_for(condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.01)


@pytest.mark.timeout(300)
def test_an_idle_engine_saves_a_finished_slot_before_the_next_request(bundled_spec):
    """The slot a request leaves goes to the cache while the engine has nothing to do, not at the next request's
    admission, which then finds it saved (one save of A's KV, before B arrives)."""
    from app.prompt.chat_template import render_prompt

    a, b = (render_prompt(bundled_spec.chat_template, [{"role": "user", "content": q}]) for q in QUESTIONS)
    engine = _one_slot_engine(bundled_spec, cache_mib=64)
    saves = []
    seq_state = engine.llama.seq_state
    engine.llama.seq_state = lambda slot: (saves.append(slot), seq_state(slot))[1]
    try:
        run_until_idle(engine, _run(engine, a))
        _wait_for(lambda: engine.stats()["prompt_cache"]["entries"] == 1, "A's KV in the cache")
        assert saves == [0]
        (start_b, _, _) = run_until_idle(engine, _run(engine, b))
        assert start_b.cached_tokens < 30
        _wait_for(lambda: engine.stats()["prompt_cache"]["entries"] == 2, "B's KV in the cache")
        assert saves == [0, 0]  # B's admission saved nothing: A's entry covered the slot
        (start_a, _, _) = run_until_idle(engine, _run(engine, a))
        assert start_a.cached_tokens == start_a.prompt_tokens - 1
    finally:
        engine.close()


@pytest.mark.timeout(300)
def test_a_busy_engine_saves_nothing_early(bundled_spec):
    """A slot that finishes while another stream decodes is saved only once the engine is idle: saving on the
    decode thread would hold up every running stream's next token."""
    from app.engine import LlamaEngine
    from app.engine.stream import publish_to_loops
    from app.prompt.chat_template import render_prompt

    a, b = (render_prompt(bundled_spec.chat_template, [{"role": "user", "content": q}]) for q in QUESTIONS)
    engine = LlamaEngine(dataclasses.replace(bundled_spec, n_seq_max=2, prompt_cache_mib=64),
                         publish=publish_to_loops).start()
    try:
        async def scenario():
            long = GenerationRequest(request_id=uuid.uuid4().hex, prompt=a, max_tokens=48, stop=[],
                                     sampling=SamplingParams(temperature=0.0, logit_bias=_no_end(engine)))
            stream = generate_stream(engine, long, 0)
            await anext(stream)  # admitted, decoding
            await _run(engine, b)  # finishes within a few steps, long before the other's 48 tokens
            rest = [ev for _ in range(4) for ev in await anext(stream)]  # four more steps of the long one
            during = engine.stats()["prompt_cache"]["entries"]
            rest += [ev async for batch in stream for ev in batch]
            return during, rest[-1]
        during, end = run_until_idle(engine, scenario())
        assert during == 0
        assert end.completion_tokens == 48
        _wait_for(lambda: engine.stats()["prompt_cache"]["entries"] == 2, "both slots in the cache once idle")
    finally:
        engine.close()
