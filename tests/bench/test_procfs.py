"""bench.harness.procfs: the /proc reads the bench and the test harness share."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.harness import procfs


def test_stat_fields_count_after_the_last_parenthesis_of_the_command_name():
    rest = procfs.stat_fields("42 (ray::Serve Replica:) x) S 7 42 42 0 -1 0 0 0 0 0 300 100 0 0")
    assert rest[0] == "S" and rest[1] == "7" and rest[3] == "42" and rest[11:13] == ["300", "100"]


def test_a_live_child_reads_with_its_parent_and_command_line_and_a_gone_one_as_none():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "--marker-xyz"])
    try:
        assert child.pid in set(procfs.pids())
        rest = procfs.read_stat(child.pid)
        assert rest is not None and int(rest[1]) == os.getpid()
        assert b"--marker-xyz" in (procfs.read_cmdline(child.pid) or b"")
    finally:
        child.kill()
        child.wait()
    assert procfs.read_stat(child.pid) is None and procfs.read_cmdline(child.pid) is None
    assert child.pid not in set(procfs.pids())
