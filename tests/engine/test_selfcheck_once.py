"""The startup self-check runs once per file and settings in a process: a pool reloading an evicted model does
not pay the child again; a changed file, other settings or a failure check again."""

from __future__ import annotations

import dataclasses
import os
import shutil

import pytest

from app.engine import selfcheck
from app.engine.selfcheck import EngineUnavailable, self_check_once


@pytest.fixture
def spec(bundled_spec, tmp_path, monkeypatch):
    monkeypatch.setattr(selfcheck, "_passed", {})
    path = tmp_path / "model.gguf"
    shutil.copyfile(bundled_spec.path, path)
    return dataclasses.replace(bundled_spec, path=str(path))


class Runs:
    def __init__(self, fail: bool = False) -> None:
        self.specs: list = []
        self.fail = fail

    def __call__(self, spec):
        self.specs.append(spec)
        if self.fail:
            raise EngineUnavailable("crashed")
        return {"ok": True, "n": len(self.specs)}


def test_a_passed_check_is_not_run_again_for_the_same_file_and_settings(spec):
    runs = Runs()
    assert self_check_once(spec, runs) == {"ok": True, "n": 1}
    assert self_check_once(dataclasses.replace(spec), runs) == {"ok": True, "n": 1}
    assert len(runs.specs) == 1


def test_a_changed_file_or_other_settings_are_checked_again(spec):
    runs = Runs()
    self_check_once(spec, runs)
    self_check_once(dataclasses.replace(spec, n_threads=spec.n_threads + 1), runs)
    assert len(runs.specs) == 2
    st = os.stat(spec.path)
    os.utime(spec.path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the file replaced in place
    self_check_once(spec, runs)
    assert len(runs.specs) == 3


def test_a_failure_is_not_remembered(spec):
    with pytest.raises(EngineUnavailable):
        self_check_once(spec, Runs(fail=True))
    runs = Runs()
    self_check_once(spec, runs)
    assert len(runs.specs) == 1


def test_the_real_check_passes_once_then_answers_from_memory(spec):
    first = self_check_once(spec)
    assert first["ok"] is True
    assert self_check_once(spec, Runs(fail=True)) is first  # the failing runner is never called
