"""bench.structured's workloads build the grammars the server would, its validity checks can say no,
and its table shows each variant against the unconstrained run."""

from __future__ import annotations

import json

from llguidance import LLMatcher

from bench.structured import WORKLOADS, summarize


def test_each_workload_builds_a_prompt_and_a_grammar(bundled_spec):
    for work in WORKLOADS.values():
        prompt, grammar = work.build(bundled_spec.chat_template, 7)
        assert "7" in prompt and LLMatcher.validate_grammar(grammar) == "", work.name


def test_the_checks_accept_a_valid_reply_and_refuse_others():
    small = WORKLOADS["json-small"].check
    good = {"name": "A", "age": 3, "address": {"city": "B", "zip": "1"}, "tags": [], "active": True}
    assert small(json.dumps(good))
    assert not small(json.dumps({**good, "age": 300}))
    assert not small(json.dumps(good)[:-1])
    tools = WORKLOADS["tools-20"].check
    assert tools('<tool_call>\n{"name": "find_3", "arguments": {"q": "x"}}\n</tool_call>')
    assert not tools('<tool_call>\n{"name": "find_99", "arguments": {"q": "x"}}\n</tool_call>')
    assert not tools('<tool_call>\n{"name": "find_3", "arguments": {}}\n</tool_call>')


def test_the_table_puts_the_constrained_run_beside_the_plain_one():
    def row(tok_s):
        return {"tok_s": tok_s, "decode_tok_s": tok_s + 10, "ttft_ms": 10.0, "sample_cpu_ms": 0.25, "finished": 1,
                "valid": 1}
    results = {"json-small c=1": {"plain": [row(100.0), row(80.0)], "constrained": [row(90.0), row(88.0)]}}
    line = summarize(results, {"json-small": 1.5}).splitlines()[-1]
    assert line.startswith("| json-small | 1 | 100.0 | 99.0 (0.99x) | 90.0 / 89.0 | 10 / 10 |"), line
    assert line.endswith("| 0.25 / 0.25 | 2 / 2 | 1.5 |"), line
