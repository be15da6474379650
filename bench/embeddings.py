"""Embeddings per second: llamaray's /v1/embeddings vs llama-server's (`--embedding`), same GGUF
(all-MiniLM-L6-v2, tools/minilm_gguf.py), same threads and sequences, in the same run.

Each level is a number of concurrent clients, each sending requests of `--batch` short sentences back to back
for `--seconds`; the servers take turns level by level (the idle one paused with SIGSTOP, as `python -m bench`
does), so neither gets the machine's better minutes. llamaray runs as `make run` serves (`llamaray serve-local`,
topology single) with the embedding model alone.

    python -m bench.embeddings [--llama-server PATH] [--batch 16] [--clients 1,4] [--seconds 20]

Writes bench-results/embeddings.json and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tools.minilm_gguf import cached_gguf

from app.ops.ray_env import port_state

from .harness.run import ROOT, log
from .harness.servers import LLAMA_SERVER_DIR, LlamarayServer, Server, ensure_llama_server

MODEL_ID = "minilm"
WORDS = ("the quick brown fox jumps over a lazy dog while small birds sing in tall green trees near the old "
         "river bank and children play with a red ball").split()


def sentences(n: int, rng: random.Random) -> list[str]:
    """Short inputs (8-14 words, about 10-17 tokens), each different so no server can reuse one."""
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 14))) + f" {rng.randint(0, 10**6)}."
            for _ in range(n)]


class EmbeddingLlamaServer(Server):
    name = "llama-server"

    def __init__(self, log_dir: Path, binary: Path | None, gguf: Path, threads: int, parallel: int) -> None:
        super().__init__(log_dir)
        self.binary, self.gguf, self.threads, self.parallel = binary, gguf, threads, parallel

    def prepare(self) -> None:
        self.binary = self.binary or ensure_llama_server(self.log_dir)

    def command(self) -> list[str]:
        # n_batch = n_ubatch = 512, as llamaray's embedding context: a non-causal model's batch is one micro-batch.
        return [self.binary, "-m", self.gguf, "--embedding", "--pooling", "mean", "-t", self.threads,
                "-tb", self.threads, "-np", self.parallel, "-c", self.parallel * 512, "-b", 512, "-ub", 512,
                "--alias", MODEL_ID, "--no-webui", "--host", "127.0.0.1", "--port", self.port]


class EmbeddingLlamaray(LlamarayServer):
    """`llamaray serve-local` on a config with the embedding model alone (topology single)."""

    name = "llamaray"
    config_file = "serve_bench_embeddings.yaml"

    def __init__(self, log_dir: Path, gguf: Path, threads: int, parallel: int) -> None:
        super().__init__(log_dir)
        self.gguf, self.threads, self.parallel = gguf, threads, parallel

    def prepare(self) -> None:
        self.config_path = ROOT / "build" / self.config_file
        self.config_path.parent.mkdir(parents=True, exist_ok=True)
        config = {
            "http_options": {"host": "127.0.0.1", "port": self.port},
            "applications": [{
                "name": "llamaray", "route_prefix": "/", "import_path": "deployments.builder:build_app",
                "args": {"models": [{"id": MODEL_ID, "kind": "embedding", "model_path": str(self.gguf),
                                     "n_threads": self.threads, "n_seq_max": self.parallel, "n_gpu_layers": 0}],
                         "topology": "single", "auth": {"required": False}},
                "deployments": [{"name": "Ingress", "autoscaling_config": {"min_replicas": 1, "max_replicas": 1},
                                 "ray_actor_options": {"num_cpus": 1, "num_gpus": 0}}],
            }],
        }
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        state = port_state("127.0.0.1", self.port)
        if state != "free":
            raise RuntimeError(f"port {self.port} is {state}")
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="lrb-", dir="/tmp"))


async def drive(url: str, clients: int, batch: int, seconds: float, seed: int) -> dict[str, Any]:
    """`clients` loops of requests of `batch` inputs for `seconds`: inputs embedded per second, latency."""
    rng = random.Random(seed)
    latencies: list[float] = []
    done = 0
    errors = 0

    async def one(client: httpx.AsyncClient, deadline: float) -> None:
        nonlocal done, errors
        while time.monotonic() < deadline:
            body = {"model": MODEL_ID, "input": sentences(batch, rng)}
            t0 = time.monotonic()
            r = await client.post(f"{url}/v1/embeddings", json=body)
            if r.status_code != 200 or len(r.json()["data"]) != batch:
                errors += 1
                continue
            latencies.append(time.monotonic() - t0)
            done += batch

    async with httpx.AsyncClient(timeout=120) as client:
        await one(client, time.monotonic() + 2)  # warm up
        done, latencies[:] = 0, []
        start = time.monotonic()
        await asyncio.gather(*(one(client, start + seconds) for _ in range(clients)))
        elapsed = time.monotonic() - start
    latencies.sort()
    return {"clients": clients, "batch": batch, "inputs_per_s": done / elapsed, "requests": len(latencies),
            "errors": errors, "p50_ms": 1000 * latencies[len(latencies) // 2] if latencies else None}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.embeddings", description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", type=Path, default=None,
                        help=f"the llama-server binary (default: built once into {LLAMA_SERVER_DIR})")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=16, help="sequences per decode (n_seq_max / -np)")
    parser.add_argument("--batch", type=int, default=16, help="inputs per request")
    parser.add_argument("--clients", default="1,4", help="concurrent clients per level, comma separated")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "embeddings.json")
    args = parser.parse_args()
    gguf = cached_gguf()
    log_dir = args.out.parent / "embeddings-logs"
    servers = [EmbeddingLlamaray(log_dir, gguf, args.threads, args.parallel),
               EmbeddingLlamaServer(log_dir, args.llama_server, gguf, args.threads, args.parallel)]
    rows: list[dict[str, Any]] = []
    try:
        for server in servers:
            server.start()
            server.pause()
        for level, clients in enumerate(int(c) for c in args.clients.split(",")):
            for server in servers:
                server.resume()
                row = asyncio.run(drive(server.base_url, clients, args.batch, args.seconds, seed=level))
                server.pause()
                rows.append({"server": server.name, **row})
                log(f"{server.name}: {clients} clients x {args.batch} inputs: {row['inputs_per_s']:.0f} inputs/s")
    finally:
        for server in servers:
            server.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"threads": args.threads, "parallel": args.parallel, "rows": rows}, indent=2))
    print("\n| server | clients | inputs/request | embeddings/s | p50 request (ms) |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['server']} | {r['clients']} | {r['batch']} | {r['inputs_per_s']:.0f} | {r['p50_ms']:.0f} |")


if __name__ == "__main__":
    main()
