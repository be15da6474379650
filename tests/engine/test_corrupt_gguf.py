"""A GGUF llama.cpp refuses (the bundled model cut short: its header reads, its tensors lie past the end) fails
its load saying llama.cpp's own reason, in process and in the startup self-check's child, naming the file by
its name only (the message reaches clients as a 503)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from app.engine.llama import LlamaModelContext, ModelLoadError
from app.engine.selfcheck import EngineUnavailable, run_self_check


@pytest.fixture(scope="module")
def cut_spec(bundled_spec, tmp_path_factory):
    whole = Path(bundled_spec.path).read_bytes()
    cut = tmp_path_factory.mktemp("cut") / "cut-short.gguf"
    cut.write_bytes(whole[: len(whole) // 2])
    return dataclasses.replace(bundled_spec, id="cut", path=str(cut))


def test_a_load_llama_cpp_refuses_says_its_reason(cut_spec):
    with pytest.raises(ModelLoadError) as refused:
        LlamaModelContext(cut_spec.path, n_ctx_per_seq=64, n_seq_max=1, n_batch=32, n_threads=1, n_threads_batch=1,
                          n_gpu_layers=0, kv_unified=True)
    message = str(refused.value)
    assert "cut-short.gguf" in message and "corrupted or incomplete" in message, message
    assert str(Path(cut_spec.path).parent) not in message


def test_the_self_check_reports_the_files_fault_not_the_machines(cut_spec):
    with pytest.raises(EngineUnavailable) as refused:
        run_self_check(cut_spec, timeout_s=120)
    message = str(refused.value)
    assert message.startswith("model 'cut': llama.cpp could not load cut-short.gguf: "), message
    assert "corrupted or incomplete" in message
    assert "CPU" not in message and str(Path(cut_spec.path).parent) not in message
