"""`make gpu-check` (bench/gpu_check.py): the parts that run without a GPU. The GPU path itself ran
on an H200 (docs/benchmarks.md); here: a node without a driver is told so, every later step is
reported skipped with its reason, the CPU build is reported as unable to offload, and the table."""

from __future__ import annotations

import json
import os
import sys

from bench import gpu_check


def test_a_node_without_a_gpu_is_told_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    assert gpu_check.main(["--out", str(tmp_path / "out")]) == 1
    report = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    status = {s["name"]: (s["status"], s["detail"]) for s in report["steps"]}
    assert status["gpu"] == ("FAIL", "nvidia-smi not found: no NVIDIA driver on this node")
    assert all(status[n][0] == "SKIP" for n in ("build", "offload", "load", "graph", "bench"))
    assert "| gpu | FAIL |" in (tmp_path / "out" / "gpu-check.md").read_text()


def test_the_cpu_build_cannot_offload():
    step = gpu_check.check_offload({**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert step.status == "FAIL" and "false" in step.detail


def test_table_has_one_row_per_server_and_two_cells_per_level():
    results = {"a": {1: {"tokens_per_s": 10.4, "ttft_ms": {"p50": 12.0}}}, "b": {1: {"tokens_per_s": 20.0}}}
    lines = gpu_check.table(results, [1, 16]).splitlines()
    assert lines[0] == "| server | c=1 tok/s | c=1 TTFT p50 | c=16 tok/s | c=16 TTFT p50 |"
    assert lines[2] == "| a | 10 | 12 ms | - | - |" and lines[3] == "| b | 20 | - | - | - |"
