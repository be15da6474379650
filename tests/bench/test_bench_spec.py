"""bench.spec end to end on its smallest run (engine arms only: llama-server is built by the bench itself): every
arm's row is printed with its ratio to `off`, and verifying every proposal on the copy workload drafts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.model


# Runs every arm of the bench, llama-server's included (~17 s here): make test-slow.
@pytest.mark.slow
def test_a_short_run_reports_each_arm(tmp_path):
    out = subprocess.run([sys.executable, "-m", "bench.spec", "--rounds", "1", "--concurrency", "1",
                          "--max-tokens", "12", "--arms", "off,lookup,draft-always", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    report = json.loads(out.strip().splitlines()[-1])
    rows = {(r["workload"], r["arm"]): r for r in report["rows"]}
    assert set(rows) == {(w, a) for w in ("copy", "free") for a in ("off", "lookup", "draft-always")}
    assert all(r["tok_s"] > 0 for r in rows.values()) and rows[("copy", "off")]["x_off"] == 1.0
    assert rows[("copy", "draft-always")]["drafted_per_token"] > 0
    assert report["step_ms"] and min(report["step_ms"].values()) > 0
