"""bench.tenants' pure parts: the keys file it writes (policies the server reads, both keys of one priority)
and its rows and table."""

from __future__ import annotations

import pytest

from app.tenants.policies import key_hash, parse_key_policies
from bench.tenants import arm_row, format_table, keys_file
from bench.load.loadgen import RequestResult


def test_the_keys_file_holds_both_keys_hashed_with_equal_priority(tmp_path):
    path = tmp_path / "keys.yaml"
    keys = keys_file(path)
    text = path.read_text()
    assert all(key not in text for key in keys.values())  # hashes only
    policies = {p.name: p for p in parse_key_policies(text)}
    assert set(policies) == {"greedy", "polite"}
    assert {p.priority for p in policies.values()} == {"normal"}
    assert all(policies[name].key_sha256 == key_hash(key) for name, key in keys.items())


def _results(ttfts: list[float]) -> list[RequestResult]:
    return [RequestResult(index=i, prompt_index=0, ttft_s=t, completion_tokens=8, start=0.0, end=t + 1, outcome="ok")
            for i, t in enumerate(ttfts)]


def test_a_row_compares_the_polite_keys_ttft_beside_the_greedy_key_with_alone():
    seg = {"alone": _results([0.1, 0.1, 0.1]), "alone_wall_s": 10.0, "beside": _results([0.12, 0.12, 0.12]),
           "beside_wall_s": 10.0, "greedy": _results([1.0] * 10), "greedy_wall_s": 13.0}
    row = arm_row("fair", [seg])
    assert row["alone_ttft_p50_ms"] == pytest.approx(100)
    assert row["beside_ttft_p50_ms"] == pytest.approx(120)
    assert row["p50_increase"] == pytest.approx(0.2)
    assert row["greedy_n"] == 10 and row["failed"] == 0
    table = format_table([row], {"fcfs": "not started"})
    assert "| fair | 100 / 100 (3) | 120 / 120 (3) | +20% |" in table
    assert "fcfs: not started" in table
