"""bench.pool's pure parts: the Zipf popularity and the per-request draw both arms share, the two arms' configs
(check-config passes both on 2 CPUs), the metrics it reads, and its table."""

from __future__ import annotations

from collections import Counter

import pytest

from app.ops.capacity import Capacity
from app.ops.config_check import check_config
from bench.pool import (
    arm_config,
    arm_record,
    format_table,
    metric_total,
    model_ids,
    model_of,
    pool_counts,
    zipf_weights,
)
from bench.harness.arms import turn_order
from bench.load.loadgen import RequestResult


def test_zipf_weights_fall_as_one_over_k_to_the_s():
    w = zipf_weights(6, 1.0)
    assert sum(w) == pytest.approx(1.0)
    assert [w[0] / x for x in w] == pytest.approx([1, 2, 3, 4, 5, 6])
    assert zipf_weights(4, 0.0) == pytest.approx([0.25] * 4)
    assert zipf_weights(3, 2.0)[0] / zipf_weights(3, 2.0)[2] == pytest.approx(9)
    with pytest.raises(ValueError):
        zipf_weights(0, 1.0)


def test_each_request_draws_its_model_the_same_way_every_time_with_zipfs_shares():
    w = zipf_weights(6, 1.0)
    first = [model_of(i, w) for i in range(200)]
    assert first == [model_of(i, w) for i in range(200)]  # both arms ask the same sequence
    counts = Counter(model_of(i, w) for i in range(30_000))
    for k, share in enumerate(w):
        assert counts[k] / 30_000 == pytest.approx(share, abs=0.015)
    assert model_ids() == ["m1", "m2", "m3", "m4", "m5", "m6"]


def test_both_arms_pass_check_config_on_two_cpus():
    two_cpus = Capacity({"CPU": 2, "GPU": 0, "memory": 8 * 2**30}, "two cores")
    for arm in ("pool", "dedicated"):
        config = arm_config(arm, 8999)
        assert check_config(config, capacity=two_cpus) == [], arm
    pool = arm_config("pool", 8999)["applications"][0]
    assert pool["args"]["pools"] == [{"name": "fleet", "max_models": 2}]
    assert {m["pool"] for m in pool["args"]["models"]} == {"fleet"}
    dedicated = arm_config("dedicated", 8999)["applications"][0]
    cpus = [d["ray_actor_options"]["num_cpus"] for d in dedicated["deployments"] if d["name"].startswith("LlamaModel-")]
    assert len(cpus) == 6 and sum(cpus) <= 2


METRICS = """# HELP ray_llamaray_pool_loads_total Models a pool replica loaded
ray_llamaray_pool_loads_total{model="m1",outcome="ok",pool="fleet",ReplicaId="x"} 3.0
ray_llamaray_pool_loads_total{model="m2",outcome="ok",pool="fleet",ReplicaId="y"} 2.0
ray_llamaray_pool_loads_total{model="m3",outcome="failed",pool="fleet",ReplicaId="y"} 1.0
ray_llamaray_pool_evictions_total{model="m2",pool="fleet",reason="lru"} 4.0
ray_llamaray_pool_load_seconds_count{model="m1",pool="fleet"} 9.0
ray_llamaray_pool_load_seconds_sum{pool="fleet"} 2.5
ray_llamaray_pool_room_wait_seconds_count{pool="fleet"} 2.0
ray_llamaray_pool_room_wait_seconds_sum{pool="fleet"} 3.0
"""


def test_pool_counts_sum_the_metric_samples_by_label():
    assert metric_total(METRICS, "ray_llamaray_pool_loads_total") == 6.0
    assert metric_total(METRICS, "ray_llamaray_pool_loads_total", model="m1") == 3.0
    assert pool_counts(METRICS) == {"loads": 5.0, "load_failures": 1.0, "evictions": 4.0, "load_s": 2.5,
                                    "room_waits": 2.0, "room_wait_s": 3.0}
    assert set(pool_counts("").values()) == {0.0}


def result(index: int, ttft_s: float, tokens: int, outcome: str = "ok") -> RequestResult:
    return RequestResult(index=index, prompt_index=0, start=0.0, end=1.0, outcome=outcome, ttft_s=ttft_s,
                         completion_tokens=tokens)


def test_an_arms_row_pools_its_segments_and_the_table_gives_the_ratio():
    seg = {"wall_s": 30.0, "busy_503": 1, "per_model": {"m1": 2, "m2": 1}, "cpu": {"other_cores": 0.3, "server_cores": 1.0},
           "pool": {"loads": 3.0, "evictions": 2.0, "load_failures": 0.0, "load_s": 1.5, "room_waits": 1.0,
                    "room_wait_s": 2.0},
           "ttfts": {"m1": [0.1, 0.3], "m2": [0.2]}}
    pool = arm_record("pool", [{**seg, "results": [result(0, 0.1, 60), result(1, 0.3, 60)]},
                               {**seg, "results": [result(2, 0.2, 60)], "cpu": {"other_cores": 0.6, "server_cores": 0.5}}])
    assert pool["n_requests"] == 3 and pool["busy_503"] == 2
    assert pool["tokens_per_s"] == pytest.approx(180 / 60)
    assert pool["ttft_p50_ms"] == pytest.approx(200)
    assert pool["cold_loads_per_min"] == pytest.approx(6.0) and pool["evictions_per_min"] == pytest.approx(4.0)
    assert pool["server_cores"] == pytest.approx(0.75)
    assert pool["other_cores"] == 0.6 and pool["per_model"] == {"m1": 4, "m2": 2}
    dedicated = arm_record("dedicated", [{**seg, "pool": {}, "results": [result(0, 0.1, 120), result(1, 0.1, 120)]}])
    assert dedicated["cold_loads_per_min"] == 0
    text = format_table([pool, dedicated], {"other": "not started"})
    assert "| pool | 3 | 0 | 2 | 3.0 | 200 |" in text
    assert "pool / dedicated: tok/s x0.38, TTFT p50 x2.00" in text
    assert "other: not started" in text
    # A cold request's parts, apart: 6 loads of 0.5 s, 2 waits for room of 2 s; TTFT p50 by model.
    assert pool["load_s_mean"] == pytest.approx(0.5) and pool["room_wait_s_mean"] == pytest.approx(2.0)
    assert pool["ttft_p50_ms_per_model"] == {"m1": pytest.approx(200), "m2": pytest.approx(200)}
    assert "pool: a load 0.50 s on average; 2 requests waited for room, 2.00 s on average" in text
    assert "TTFT p50 ms per model: pool m1 200, m2 200" in text


def test_the_arms_take_turns_each_round_reversing_the_last():
    assert turn_order(["pool", "dedicated"], 3) == ["pool", "dedicated", "dedicated", "pool", "pool", "dedicated"]
