"""llama-server as the oracle of `/infill` (slow): the same GGUF (the bundled model with FIM tokens,
tools/fim_gguf.py), the same context and batch as the shared clusters' THINKING_MODEL, the same bodies; both
answer with the same prompt (llama-server's `prompt`, the layout detokenized with its control tokens, against
our /tokenize of the same fields detokenized alike), the same `tokens_evaluated`, and the same greedy reply and
`tokens_predicted`, in both topologies.

It needs llama-server built from the llama.cpp that llama-cpp-python vendors (build/llama-server/bin/llama-server,
stamped with its version and build flags). The benches build it once (`python -m bench`, or
`bench.harness.servers.ensure_llama_server`: it downloads the llama-cpp-python sdist and compiles the
`llama-server` target, tens of minutes on 2 cores); this test never builds it, and skips saying so where it is
not there.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import httpx
import pytest

from bench.harness.servers import LLAMA_SERVER_DIR, Server, llama_cpp_python_version
from tests.support.serve_harness import THINKING_MODEL
from tools.fim_gguf import cached_gguf
from tools.llama_build import build_env, build_key

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

BINARY = LLAMA_SERVER_DIR / "bin" / "llama-server"
N_CTX, N_BATCH = 1024, 512  # THINKING_MODEL's, in tests/support/serve_harness.py (n_batch: the default)
BODIES = [
    {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n\nprint(add(1, 2))\n"},
    {"input_prefix": "import math\n\ndef area(r):\n", "input_suffix": "\n", "prompt": "    ",
     "input_extra": [{"filename": "geometry.py", "text": "PI = 3.14159\n"}, {"text": "# notes\n"}]},
    {"input_prefix": "<issue_start> stays text\nx = ", "input_suffix": "", "n_predict": 24},
]


def built() -> bool:
    stamp = LLAMA_SERVER_DIR / "VERSION"
    if not BINARY.is_file() or not stamp.is_file():
        return False
    version = llama_cpp_python_version()
    return stamp.read_text().strip() == f"{version} {build_key(build_env(cuda=False, cuda_arch=None), version)}"


class FimLlamaServer(Server):
    name = "llama-server-fim"

    def command(self) -> list[str]:
        return [str(BINARY), "-m", str(cached_gguf()), "-c", str(N_CTX), "-np", "1", "-b", str(N_BATCH),
                "-t", "2", "--no-webui", "--host", "127.0.0.1", "--port", str(self.port)]


@pytest.fixture(scope="module")
def llama_server():
    if not built():
        pytest.skip(f"llama-server is not built here ({BINARY}, for llama-cpp-python {llama_cpp_python_version()}): "
                    f"the benches build it once (python -m bench, bench.harness.servers.ensure_llama_server)")
    server = FimLlamaServer(Path(tempfile.mkdtemp(prefix="llamaray-oracle-")))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("body", BODIES)
def test_infill_matches_llama_server(llama_server, http, body):
    request = {"n_predict": 16, "temperature": 0, "cache_prompt": False, **body}
    theirs = httpx.post(f"{llama_server.base_url}/infill", json=request, timeout=300)
    assert theirs.status_code == 200, theirs.text
    ours = http.post("/infill", json={"model": THINKING_MODEL, **request})
    assert ours.status_code == 200, ours.text
    theirs, ours = theirs.json(), ours.json()
    fields = {k: body[k] for k in ("input_prefix", "input_suffix", "input_extra", "prompt") if k in body}
    layout = http.post("/tokenize", json={"model": THINKING_MODEL, **fields}).json()["tokens"]
    text = http.post("/detokenize", json={"model": THINKING_MODEL, "tokens": layout}).json()["prompt"]
    assert text == theirs["prompt"]
    assert ours["tokens_evaluated"] == theirs["tokens_evaluated"] == len(layout)
    assert ours["content"] == theirs["content"]
    assert ours["tokens_predicted"] == theirs["tokens_predicted"]
    assert ours["stop_type"] == theirs["stop_type"]


def test_no_fim_tokens_is_refused_by_both(tmp_path):
    """The bundled GGUF as shipped has no FIM prefix, suffix or middle token: llama-server refuses /infill on it
    too (501, `not_supported_error`), where llamaray's 400 names the model (tests/graph/test_infill_graph.py)."""
    if not built():
        pytest.skip(f"llama-server is not built here ({BINARY})")
    from tools.make_lora import bundled_base

    class Plain(FimLlamaServer):
        name = "llama-server-plain"

        def command(self) -> list[str]:
            cmd = super().command()
            cmd[2] = str(bundled_base())
            return cmd

    server = Plain(tmp_path)
    try:
        server.start()
        r = httpx.post(f"{server.base_url}/infill", json={"input_prefix": "a", "input_suffix": "b"}, timeout=60)
        assert r.status_code == 501 and "Infill is not supported" in r.text
    finally:
        server.stop()
