"""python -m bench.profile: where a llamaray server's CPU goes while it streams, as flame graphs.

Starts one server of bench/harness/servers.py (`llamaray`: `make run`'s shape; `llamaray-graph`: the cluster's three
deployments on this machine), drives the bench's closed loop (same prompts, 128 tokens, temperature 0.7)
at each concurrency, and meanwhile records py-spy (non-blocking, so the sampler does not pause the
replica it measures) on each of the server's Python tiers. Writes, per tier and concurrency, an SVG flame
graph and py-spy's collapsed stacks, and prints where the samples went: per thread, and the frames that
hold the most samples (inclusive). A thread inside `llama_decode` is busy (not idle) to py-spy, so the
share of the engine thread's samples outside `decode` is the Python the engine spends per step.

    python -m bench.profile --server llamaray --concurrency 1,16 --seconds 30 --out bench-results/profile
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import time
from pathlib import Path

from .harness.procs import sample, tier_of
from .harness.pyspy import collapsed, record, summarise, thread_cpu
from .harness.run import ROOT, VENV_BIN, log
from .harness.servers import SERVERS
from .load.loadgen import DEFAULT_PROMPTS, run_closed_loop

PROFILED_TIERS = ("ingress", "chat_processor", "model", "proxy")


def tier_pids(sid: int, app: str = "llamaray") -> dict[str, list[int]]:
    """The server's Python tiers by pid (Ray names each replica's process after its deployment)."""
    out: dict[str, list[int]] = {}
    for pid, s in sample(sid).items():
        tier = tier_of(s.title, app)
        if tier in PROFILED_TIERS:
            out.setdefault(tier, []).append(pid)
    return out


async def level(server, concurrency: int, seconds: float, out: Path, rate: int) -> None:
    pids = tier_pids(server.session_id)
    log(f"c={concurrency}: profiling {', '.join(f'{t} {p}' for t, ps in pids.items() for p in ps)}")
    await run_closed_loop(server.base_url, server.model, 1, 1, DEFAULT_PROMPTS, max_tokens=16)  # warm
    # --rate 0: CPU per thread only (py-spy's own sampling takes CPU from a 2-core machine's llama.cpp threads)
    samplers = {(tier, pid): record(pid, seconds, out / f"{tier}-{pid}-c{concurrency}", rate) if rate else []
                for tier, ps in pids.items() for pid in ps}
    done: list[int] = []
    cpu0 = {pid: thread_cpu(pid) for ps in pids.values() for pid in ps}
    t0 = time.perf_counter()
    load = asyncio.ensure_future(run_closed_loop(
        server.base_url, server.model, concurrency, 10_000, DEFAULT_PROMPTS, max_tokens=128, seed_base=1000,
        on_result=lambda r: done.append(r.completion_tokens or 0)))
    await asyncio.sleep(seconds + 1)
    load.cancel()
    wall = time.perf_counter() - t0
    cpu1 = {pid: thread_cpu(pid) for pid in cpu0}
    for procs in samplers.values():
        for p in procs:
            p.wait(timeout=60)
    try:
        await load
    except asyncio.CancelledError:
        pass
    for (tier, pid), _ in samplers.items():
        raw = out / f"{tier}-{pid}-c{concurrency}.txt"
        print(f"\n== {server.name} c={concurrency} {tier} (pid {pid}), {wall:.0f} s, {len(done)} requests ended, "
              f"{sum(done) / wall:.1f} tok/s in them: {raw.with_suffix('.svg')}")
        used = {t: cpu1[pid][t] - cpu0[pid].get(t, 0.0) for t in cpu1[pid]}
        print(f"  CPU by thread (/proc): {sum(used.values()) / wall:.2f} cores in all")
        for t, s in sorted(used.items(), key=lambda kv: -kv[1]):
            if s >= 0.01 * wall:
                print(f"  {s / wall:6.3f} cores  {t}")
        if rate:
            print("\n".join(summarise(collapsed(raw))))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default="llamaray", choices=["llamaray", "llamaray-graph"])
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second (0: no py-spy, CPU per thread only)")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "profile")
    ns = p.parse_args(argv)
    ns.concurrency = [int(c) for c in ns.concurrency.split(",") if c.strip()]
    return ns


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    if shutil.which(str(VENV_BIN / "py-spy")) is None:
        raise SystemExit("py-spy is not installed in the venv (make install installs the dev extras)")
    ns.out.mkdir(parents=True, exist_ok=True)
    server = SERVERS[ns.server](ns.out / "logs")
    try:
        server.start()
        for c in ns.concurrency:
            asyncio.run(level(server, c, ns.seconds, ns.out, ns.rate))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
