"""bench/hostile.py's pieces, without a server: the hostile bodies stay within the server's limits (so
they reach the model, not a 413), and gaps are measured per stream within the hostile window."""

from __future__ import annotations

import json

from app.config.app_args import Limits
from app.generation.plan import check_client_grammar
from bench.hostile import big_grammar, gaps_between, hostile_requests, parse_args, scan_bomb
from bench.load.loadgen import RequestResult


def test_hostile_bodies_fit_the_default_limits():
    limits = Limits()
    by_name = {h.name: h for h in hostile_requests("m", 16, parse_args(["--url", "u", "--model", "m"]).message_bytes)}
    assert set(by_name) == {"big_message", "large_grammar", "logprobs_bomb", "n_max"}
    for h in by_name.values():
        assert len(json.dumps(h.body).encode()) < limits.max_body_bytes, h.name
    grammar = by_name["large_grammar"].body["grammar"]
    assert 50_000 < len(grammar) <= limits.max_grammar_bytes
    check_client_grammar(grammar, limits)  # the server's own bound: the bench sends what it accepts
    bomb = by_name["logprobs_bomb"].body
    assert len(bomb["prompt"]) == 128 and bomb["echo"] and bomb["logprobs"] == 20 and bomb["max_tokens"] == 0
    assert by_name["n_max"].body["n"] == 16


def test_gaps_are_per_stream_and_within_the_window():
    a = RequestResult(index=0, prompt_index=0, start=10.0, content_times=[0.1, 0.2, 0.5])
    b = RequestResult(index=1, prompt_index=0, start=20.0, content_times=[0.0, 1.0])
    assert sorted(round(g, 3) for g in gaps_between([a, b])) == [0.1, 0.3, 1.0]
    assert [round(g, 3) for g in gaps_between([a, b], 10.3, 15.0)] == [0.3]
    assert big_grammar(1000).startswith("root ::= ")


def test_image_bombs_are_jpegs_within_the_limits_that_the_server_refuses_by_their_scans():
    import asyncio

    import pytest

    from app.api.errors import APIError
    from app.images import load_image
    from app.images.jpeg_scans import jpeg_scans

    limits = Limits()
    bombs = hostile_requests("m", 16, 1000, image_count=3, images_per_request=2, only="image_bomb")
    assert [h.name for h in bombs] == ["image_bomb_0", "image_bomb_1", "image_bomb_2"]
    parts = bombs[0].body["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url", "image_url"]
    assert len(json.dumps(bombs[0].body).encode()) < limits.max_body_bytes
    assert jpeg_scans(scan_bomb()) > limits.max_jpeg_scans and len(scan_bomb()) < limits.max_image_bytes
    with pytest.raises(APIError) as info:
        asyncio.run(load_image(parts[1]["image_url"]["url"], "p", limits))
    assert info.value.code == "image_too_complex"


def test_dag_grammars_are_small_and_refused_by_the_servers_limits():
    import pytest

    from app.api.errors import APIError
    from app.generation.plan import client_gbnf
    from bench.hostile import grouped, ttfts

    bombs = hostile_requests("m", 16, 1000, only="dag_grammar", grammar_count=100)
    assert len(bombs) == 100 and bombs[0].name == "dag_grammar_0" and bombs[99].name == "dag_grammar_99"
    grammar = bombs[0].body["grammar"]
    assert len(grammar) < 400
    with pytest.raises(APIError) as info:
        client_gbnf(grammar, Limits())
    assert info.value.code == "grammar_too_complex"
    reports = [{"name": b.name, "status": 400, "code": "grammar_too_complex", "seconds": 0.01} for b in bombs]
    assert list(grouped(reports)) == [("dag_grammar", 400, "grammar_too_complex")]
    inside = RequestResult(index=0, prompt_index=0, start=5.0, ttft_s=0.2)
    outside = RequestResult(index=1, prompt_index=0, start=1.0, ttft_s=0.1)
    assert ttfts([inside, outside], 4.0, 6.0) == ([0.2], [0.1])
