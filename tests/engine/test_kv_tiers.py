"""The KV kept beyond the replica on the real engine (app/engine/kv_placement.py, kv_tiers.py, app/kvstore): a new
engine (a replaced replica, a reloaded pool model) restores a long preamble another engine prefilled from the node's
disk, an engine on "another node" restores it from the cluster's store, and the reply after a restore is the reply
after a prefill up to near-ties; a corrupted entry, another scope's entry and another KV type's entry are never
used; a q8_0 cache keeps about half the bytes of f16."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from app.engine import GenerationRequest, LlamaEngine, SamplingParams
from app.engine.events import Started
from app.prompt.chat_template import render_prompt
from tests.support.events import EventBox
from tests.support.ties import parted_at_a_tie

pytestmark = pytest.mark.model

# A preamble of an agent's kind (a system prompt and tool notes), then questions of several conversations.
PREAMBLE = ("You are a careful assistant for a shipping company. " * 12 + "Tools: track(id), refund(id), "
            "address(id). Always answer in one sentence. " * 6)
QUESTIONS = ["Where is parcel 17?", "Can I get a refund for order 5?", "What is the address of order 9?"]


def prompt(spec, question: str) -> str:
    return render_prompt(spec.chat_template, [{"role": "system", "content": PREAMBLE},
                                              {"role": "user", "content": question}],
                         bos_token=spec.bos_token, eos_token=spec.eos_token)


def ask(engine: LlamaEngine, text: str, *, scope: str = "", reuse: bool = True) -> EventBox:
    box = EventBox()
    req = GenerationRequest(request_id=f"r{id(box)}", prompt=text, max_tokens=16, logprobs=2,
                            sampling=SamplingParams(temperature=0), cache_prompt=reuse, cache_scope=scope)
    engine.submit(engine.prepare(req, box))
    assert box.wait(300), box.events
    return box


def started(box: EventBox) -> Started:
    return box.of(Started)[0]


def tiered(spec, tmp_path: Path, disk: str = "disk", store: str | None = None, **fields) -> LlamaEngine:
    spec = dataclasses.replace(spec, n_ctx=2048, n_seq_max=2, kv_disk_dir=str(tmp_path / disk),
                               kv_store=store or "", kv_min_tokens=64, **fields)
    engine = LlamaEngine(spec).start()
    assert engine.placement.tiers.wait_ready(60)
    return engine


def saved_and_closed(engine: LlamaEngine, text: str, scope: str = "") -> int:
    """Serve `text`, let the engine save it (idle: memory, then the tiers in the background), close it; the
    prompt's tokens."""
    box = ask(engine, text, scope=scope)
    tiers = engine.placement.tiers
    deadline_ok = _until(lambda: tiers.stats()["tiers"]["disk"]["saves"] >= 1)
    assert deadline_ok, engine.stats()
    assert tiers.flush()
    engine.close()
    return started(box).prompt_tokens


def _until(check, timeout_s: float = 60.0) -> bool:
    import time
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def test_a_new_engine_restores_the_preamble_from_disk_and_answers_as_after_a_prefill(bundled_spec, tmp_path):
    first = tiered(bundled_spec, tmp_path)
    n = saved_and_closed(first, prompt(first.spec, QUESTIONS[0]))
    second = tiered(bundled_spec, tmp_path)  # a replaced replica on the same node
    try:
        text = prompt(second.spec, QUESTIONS[1])
        restored = ask(second, text)
        s = started(restored)
        assert s.cached_from == "disk" and s.cached_tokens >= n - 20, (s, n)  # all of the preamble
        assert second.stats()["kv_tiers"]["tiers"]["disk"]["hits"] == 1
        prefilled = ask(second, text, reuse=False)
        assert started(prefilled).cached_tokens == 0
        parted_at_a_tie(prefilled, restored)
    finally:
        second.close()


def test_another_node_restores_from_the_cluster_store_and_keeps_it_on_its_disk(bundled_spec, tmp_path):
    store = f"file://{tmp_path / 'store'}"
    first = tiered(bundled_spec, tmp_path, "node-a", store)
    n = saved_and_closed(first, prompt(first.spec, QUESTIONS[0]))
    second = tiered(bundled_spec, tmp_path, "node-b", store)
    try:
        s = started(ask(second, prompt(second.spec, QUESTIONS[2])))
        assert s.cached_from == "cluster" and s.cached_tokens >= n - 20, s
        assert second.placement.tiers.flush()
        assert list((tmp_path / "node-b").rglob("*.kv"))  # copied to this node's disk
    finally:
        second.close()


def test_a_corrupted_entry_another_scopes_and_another_kv_types_are_never_used(bundled_spec, tmp_path):
    first = tiered(bundled_spec, tmp_path)
    saved_and_closed(first, prompt(first.spec, QUESTIONS[0]), scope="key-a")
    # Another key's scope finds nothing of key-a's.
    other = tiered(bundled_spec, tmp_path)
    try:
        assert started(ask(other, prompt(other.spec, QUESTIONS[1]), scope="key-b")).cached_from == ""
    finally:
        other.close()
    # A q8_0 cache is another key: f16 states are not even listed.
    quantized = tiered(bundled_spec, tmp_path, cache_type_k="q8_0", cache_type_v="q8_0")
    try:
        assert quantized.placement.tiers.stats()["tiers"]["disk"]["entries"] == 0
        assert started(ask(quantized, prompt(quantized.spec, QUESTIONS[1]), scope="key-a")).cached_from == ""
    finally:
        quantized.close()
    # The entry's payload flipped on disk: refused, removed, and the prompt prefilled.
    for payload in (tmp_path / "disk").rglob("*.kv"):
        data = bytearray(payload.read_bytes())
        data[len(data) // 2] ^= 0xFF
        payload.write_bytes(bytes(data))
    third = tiered(bundled_spec, tmp_path)
    try:
        s = started(ask(third, prompt(third.spec, QUESTIONS[1]), scope="key-a"))
        assert s.cached_from == "" and s.cached_tokens == 0
        assert third.stats()["kv_tiers"]["tiers"]["disk"]["refused"] >= 1
    finally:
        third.close()


def test_q8_0_keeps_about_half_the_bytes_of_f16(bundled_spec, tmp_path):
    sizes = {}
    for kind in ("f16", "q8_0"):
        engine = tiered(bundled_spec, tmp_path, f"disk-{kind}", cache_type_k=kind, cache_type_v=kind)
        try:
            box = ask(engine, prompt(engine.spec, QUESTIONS[0]))
            assert _until(lambda: engine.stats()["prompt_cache"]["entries"] == 1)  # saved once the engine idles
            sizes[kind] = engine.stats()["prompt_cache"]["bytes"] / started(box).prompt_tokens
        finally:
            engine.close()
    assert 0.45 < sizes["q8_0"] / sizes["f16"] < 0.6, sizes
