"""The prefix-aware replica choice (app/routing/prefix_routing.py) with made-up replica loads: no Ray."""

from __future__ import annotations

import random

import pytest

from app.routing.prefix_routing import (
    PrefixRecord,
    PrefixRouter,
    ReplicaLoad,
    block_hashes,
    max_chars_for,
    VACANT_NODE_RECORDS,
    router_kwargs,
)

SYSTEM = "".join(f"Rule {i}: answer the question about topic {i * 7 % 13} briefly. " for i in range(40))


def conversation(turns: int, name: str) -> str:
    text = f"<|system|>{SYSTEM}"
    for t in range(turns):
        text += f"<|user|>{name} asks question number {t} about something long enough to matter here.<|assistant|>"
        text += f"reply {t} to {name}: " + "words " * 20
    return text


def idle(*names: str, capacity: int = 4) -> dict[str, ReplicaLoad]:
    return {n: ReplicaLoad(0, capacity) for n in names}


def router(**kw) -> PrefixRouter:
    return PrefixRouter(rng=random.Random(0), **kw)


def test_block_hashes_are_chained_and_drop_the_partial_tail():
    a = block_hashes("x" * 64 + "y" * 64 + "z" * 10, 64)
    b = block_hashes("w" * 64 + "y" * 64, 64)
    assert len(a) == 2 and len(b) == 2
    assert a[1] != b[1]  # same second block, different prefix: different hash
    assert block_hashes("x" * 63, 64) == []
    assert block_hashes("x" * 64 + "y" * 64 + "q" * 70, 64)[:2] == a


def test_longest_prefix_wins():
    r = router(min_match_chars=128)
    r.sync(["a", "b", "c"])
    r.record(conversation(1, "alice"), "a")
    r.record(conversation(3, "alice"), "b")  # b saw more of alice's conversation
    r.record(conversation(2, "bob"), "c")
    choice = r.choose(conversation(4, "alice"), idle("a", "b", "c"))
    assert choice.replica == "b" and choice.reason == "prefix"
    assert choice.matched_chars >= len(conversation(3, "alice")) - 64
    assert choice.matched_chars > r.matched_chars(conversation(4, "alice"), "a")
    # bob's next turn goes where bob's history is, though all three hold the system prompt
    assert r.choose(conversation(3, "bob"), idle("a", "b", "c")).replica == "c"


def test_prefix_wins_over_a_slightly_higher_load():
    r = router(min_match_chars=128)
    r.sync(["a", "b"])
    r.record(conversation(2, "alice"), "a")
    loads = {"a": ReplicaLoad(1, 4), "b": ReplicaLoad(0, 4)}
    assert r.choose(conversation(3, "alice"), loads).replica == "a"


def test_a_busy_preferred_replica_falls_back_to_the_least_loaded():
    r = router(min_match_chars=128)
    r.sync(["a", "b", "c"])
    r.record(conversation(2, "alice"), "a")
    prompt = conversation(3, "alice")
    # full: at its max_ongoing_requests
    full = {"a": ReplicaLoad(4, 4), "b": ReplicaLoad(2, 4), "c": ReplicaLoad(1, 4)}
    choice = r.choose(prompt, full)
    assert choice.reason == "busy" and choice.order == ["c", "b", "a"]
    # imbalanced: half its capacity (here 2) above the least loaded
    imbalanced = {"a": ReplicaLoad(3, 4), "b": ReplicaLoad(1, 4), "c": ReplicaLoad(2, 4)}
    choice = r.choose(prompt, imbalanced)
    assert choice.replica == "b" and choice.reason == "busy"
    # one below the threshold: the prefix still wins
    assert r.choose(prompt, {"a": ReplicaLoad(2, 4), "b": ReplicaLoad(1, 4)}).replica == "a"


def test_imbalance_threshold_is_configurable():
    r = router(min_match_chars=128, imbalance=1)
    r.sync(["a", "b"])
    r.record(conversation(2, "alice"), "a")
    assert r.choose(conversation(3, "alice"), {"a": ReplicaLoad(1, 16), "b": ReplicaLoad(0, 16)}).replica == "b"
    r = router(min_match_chars=128)  # default: half of 16 slots
    r.record(conversation(2, "alice"), "a")
    loads = {"a": ReplicaLoad(7, 16), "b": ReplicaLoad(0, 16)}
    assert r.choose(conversation(3, "alice"), loads).replica == "a"
    loads = {"a": ReplicaLoad(8, 16), "b": ReplicaLoad(0, 16)}
    assert r.choose(conversation(3, "alice"), loads).replica == "b"
    with pytest.raises(ValueError):
        PrefixRouter(imbalance=0)


def test_unknown_prompts_go_by_load():
    r = router()
    r.sync(["a", "b", "c"])
    r.record(conversation(2, "alice"), "a")
    loads = {"a": ReplicaLoad(0, 4), "b": ReplicaLoad(2, 4), "c": ReplicaLoad(1, 4)}
    choice = r.choose("a prompt nobody has sent before " * 20, loads)
    assert choice.reason == "load" and choice.order == ["a", "c", "b"] and choice.matched_chars == 0
    loads = {"a": ReplicaLoad(3, 4), "b": ReplicaLoad(2, 4), "c": ReplicaLoad(1, 4)}
    assert r.choose("another new prompt " * 30, loads).order == ["c", "b", "a"]


def test_a_short_shared_header_is_not_a_prefix_worth_routing_on():
    r = router(min_match_chars=256)
    r.sync(["a", "b"])
    header = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM.<|im_end|>\n"
    r.record(header + "first question " * 20, "a")
    loads = {"a": ReplicaLoad(1, 4), "b": ReplicaLoad(0, 4)}
    choice = r.choose(header + "second, different question " * 20, loads)
    assert choice.replica == "b" and choice.reason == "load"


def test_equal_load_ties_go_to_the_longer_prefix_then_spread_new_prefixes():
    r = router(min_match_chars=10_000)  # no prefix ever counts: load decides
    r.sync(["a", "b"])
    r.record(conversation(1, "alice"), "a")
    assert r.choose(conversation(2, "alice"), idle("a", "b")).replica == "a"
    # a prompt neither has seen: the replica with the smaller record
    assert r.choose("fresh " * 100, idle("a", "b")).replica == "b"


def test_new_conversations_sharing_a_system_prompt_spread_by_load():
    r = router(min_match_chars=128)
    r.sync(["a", "b"])
    r.record(conversation(1, "alice"), "a")
    r.record(conversation(1, "bob"), "b")
    # carol shares the system prompt with both: equal prefixes, the less loaded one takes her
    loads = {"a": ReplicaLoad(2, 4), "b": ReplicaLoad(1, 4)}
    choice = r.choose(conversation(0, "carol"), loads)
    assert choice.replica == "b" and choice.reason == "prefix"
    assert choice.matched_chars >= len(SYSTEM) - 64


def test_unknown_load_counts_as_idle():
    r = router()
    choice = r.choose("new " * 100, {"a": ReplicaLoad(None, 4), "b": ReplicaLoad(1, 4)})
    assert choice.replica == "a"


def test_records_stay_bounded_and_keep_the_most_recent_prefixes():
    rec = PrefixRecord(max_blocks=10)
    old = block_hashes("old " * 160, 64)  # 10 blocks
    rec.add(old)
    assert rec.match(old) == 10
    new = block_hashes("new " * 64, 64)  # 4 blocks
    rec.add(new)
    assert len(rec) == 10
    assert rec.match(new) == 4
    # the old prompt lost its tail, not its head: its first 6 blocks still match
    assert rec.match(old) == 6

    r = router(max_chars=64 * 50)
    for i in range(200):
        r.record(f"prompt {i} " * 80, "a")
    assert len(r.records["a"]) == 50
    assert r.matched_chars("prompt 199 " * 80, "a") > 0
    assert r.matched_chars("prompt 0 " * 80, "a") == 0


def test_replicas_that_vanish_are_forgotten_and_new_ones_start_empty():
    r = router(min_match_chars=128)
    r.sync(["a", "b"])
    r.record(conversation(2, "alice"), "a")
    r.sync(["b", "c"])
    assert set(r.records) == {"b", "c"}
    assert r.matched_chars(conversation(3, "alice"), "a") == 0
    choice = r.choose(conversation(3, "alice"), {"b": ReplicaLoad(1, 4), "c": ReplicaLoad(0, 4)})
    assert choice.replica == "c" and choice.reason == "load"
    r.record(conversation(2, "alice"), "b")
    r.forget("b")
    assert "b" not in r.records
    # a replica dead and back under the same id starts with nothing
    r.sync(["b", "c"])
    assert r.matched_chars(conversation(3, "alice"), "b") == 0


def test_no_replica_is_an_error():
    with pytest.raises(ValueError):
        router().choose("x", {})


def test_max_chars_for_a_replica_is_what_its_slots_hold():
    assert max_chars_for(n_seq_max=4, n_ctx=4096) == 4 * 4096 * 4
    assert PrefixRouter(max_chars=max_chars_for(4, 4096), block_chars=64).max_blocks == 1024


def test_scopes_never_match_each_other():
    r = router(min_match_chars=128)
    r.sync(["a", "b"])
    r.record(conversation(2, "alice"), "a", scope="key-1")
    assert r.matched_chars(conversation(3, "alice"), "a", scope="key-1") >= len(conversation(2, "alice")) - 64
    assert r.matched_chars(conversation(3, "alice"), "a", scope="key-2") == 0
    assert r.matched_chars(conversation(3, "alice"), "a") == 0
    assert r.choose(conversation(3, "alice"), idle("a", "b"), scope="key-1").reason == "prefix"
    assert r.choose(conversation(3, "alice"), idle("a", "b"), scope="key-2").reason == "load"
    assert block_hashes("x" * 128, 64, "s") != block_hashes("x" * 128, 64, "t")


# ---- node records: the node's disk tier ------------------------------------------------------------

NODES = {"a": "n1", "b": "n1", "c": "n2", "d": "n2"}


def test_a_dead_replicas_conversation_goes_to_a_replica_on_its_node_which_restores_it_from_disk():
    r = router(min_match_chars=128, node_chars=1 << 20)
    r.sync(["a", "b", "c", "d"], NODES)
    r.record(conversation(2, "alice"), "a")
    r.sync(["b", "c", "d"], NODES)  # a died; its states stay on n1's disk
    # c on the other node is less loaded, but b restores alice's prefix from n1's disk
    loads = {"b": ReplicaLoad(1, 4), "c": ReplicaLoad(0, 4), "d": ReplicaLoad(0, 4)}
    choice = r.choose(conversation(3, "alice"), loads)
    assert choice.replica == "b" and choice.reason == "node"
    assert choice.matched_chars >= len(conversation(2, "alice")) - 64
    assert r.node_matched_chars(conversation(3, "alice"), "c") == 0
    # at equal loads too, whatever the tie-break's draw
    for seed in range(8):
        r.rng = random.Random(seed)
        choice = r.choose(conversation(3, "alice"), {"b": ReplicaLoad(0, 4), "c": ReplicaLoad(0, 4)})
        assert choice.replica == "b" and choice.reason == "node"
    # ...unless b is busy: then load wins
    loads["b"] = ReplicaLoad(4, 4)
    assert r.choose(conversation(3, "alice"), loads).reason == "load"
    # a prompt no node holds: load
    assert r.choose("fresh " * 100, {"b": ReplicaLoad(1, 4), "c": ReplicaLoad(0, 4)}).reason == "load"
    # bob shares alice's system prompt, which n1's disk holds: b, as the prefix choice would in memory
    assert r.choose(conversation(0, "bob"), {"b": ReplicaLoad(1, 4), "c": ReplicaLoad(0, 4)}).replica == "b"


def test_a_busy_holder_hands_its_conversation_to_a_replica_on_its_own_node():
    r = router(min_match_chars=128, node_chars=1 << 20)
    r.sync(["a", "b", "c"], NODES)
    r.record(conversation(2, "alice"), "a")
    loads = {"a": ReplicaLoad(4, 4), "b": ReplicaLoad(1, 4), "c": ReplicaLoad(0, 4)}
    choice = r.choose(conversation(3, "alice"), loads)
    assert choice.replica == "b" and choice.reason == "node" and choice.order[-1] == "a"
    # without node records the least loaded replica prefills it
    plain = router(min_match_chars=128)
    plain.sync(["a", "b", "c"], NODES)
    plain.record(conversation(2, "alice"), "a")
    assert plain.choose(conversation(3, "alice"), loads).replica == "c"
    assert plain.node_records == {} and plain.node_matched_chars(conversation(3, "alice"), "b") == 0


def test_on_one_node_the_node_record_changes_nothing():
    r = router(min_match_chars=128, node_chars=1 << 20)
    r.sync(["a", "b", "c"], {"a": "n1", "b": "n1", "c": "n1"})
    r.record(conversation(2, "alice"), "a")
    choice = r.choose(conversation(3, "alice"), {"a": ReplicaLoad(4, 4), "b": ReplicaLoad(2, 4), "c": ReplicaLoad(1, 4)})
    assert choice.reason == "busy" and choice.replica == "c"  # c restores from the same disk as b would


def test_node_records_outlive_replicas_stay_bounded_and_keep_scopes_apart():
    r = router(min_match_chars=128, node_chars=64 * 50)
    r.sync(["a"], {"a": "n1"})
    r.record(conversation(2, "alice"), "a", scope="key-1")
    r.forget("a")
    r.sync(["b"], {"b": "n1"})  # a replica placed on n1 later restores from its disk
    assert r.node_matched_chars(conversation(3, "alice"), "b", scope="key-1") > 0
    assert r.node_matched_chars(conversation(3, "alice"), "b", scope="key-2") == 0
    for i in range(200):
        r.record(f"prompt {i} " * 80, "b")
    assert len(r.node_records["n1"]) == 50
    # a replica whose node is not known has no node record
    r.sync(["b", "x"], {"b": "n1"})
    assert r.node_matched_chars("prompt 199 " * 80, "x") == 0 and r.node_matched_chars("prompt 199 " * 80, "b") > 0
    with pytest.raises(ValueError):
        PrefixRouter(node_chars=-1)


def test_records_of_nodes_no_replica_runs_on_are_bounded():
    r = router(node_chars=1 << 16)
    for i in range(40):  # an autoscaled cluster: each replica on a node of its own, then gone
        r.sync([f"r{i}"], {f"r{i}": f"n{i}"})
        r.record(f"prompt {i} " * 80, f"r{i}")
    r.sync(["r39"], {"r39": "n39"})
    assert len(r.node_records) == 1 + VACANT_NODE_RECORDS
    assert "n39" in r.node_records and "n38" in r.node_records and "n0" not in r.node_records
    # a node that has a replica again keeps its record whatever vacated after it
    r.sync(["r39", "x"], {"r39": "n39", "x": "n38"})
    for i in range(40, 80):
        r.sync(["r39", "x", f"r{i}"], {"r39": "n39", "x": "n38", f"r{i}": f"n{i}"})
        r.record(f"prompt {i} " * 80, f"r{i}")
    assert r.node_matched_chars("prompt 38 " * 80, "x") > 0


def test_the_builder_keeps_node_records_only_where_the_model_has_a_disk_tier():
    assert router_kwargs(4, 4096, disk_tier=False) == {"max_chars": max_chars_for(4, 4096)}
    on = router_kwargs(4, 4096, disk_tier=True)
    assert on["max_chars"] == max_chars_for(4, 4096) and on["node_chars"] > on["max_chars"]
