"""python -m bench.serve_hop [--calls 100]: what one of the graph's hops costs in Ray Serve itself, with nothing
of llamaray's in it. A `Caller` replica calls a `Callee` replica's streaming method through a Serve handle, by
value over gRPC as the graph's streams go (deployments/handles.py), one call at a time, and reads two times
per call: the callee's method entered (the caller's clock read in the call, the callee's on entry: one
machine), and its first item back at the caller. Ray starts with `make run`'s settings (app/ops/ray_env.py;
Serve's proxy on a free port) in a temporary directory of its own. Prints one JSON line of medians in ms.
Run by `python -m bench.hops`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serve_hop")
    p.add_argument("--calls", type=int, default=100)
    ns = p.parse_args(argv)
    from app.ops.ray_env import LOCAL_RAY_ENV, QUIET_RAY_ENV
    for key, value in {**LOCAL_RAY_ENV, **QUIET_RAY_ENV}.items():
        os.environ.setdefault(key, value)
    tmp = tempfile.mkdtemp(prefix="lrh-", dir="/tmp")  # short: Ray's unix socket paths
    os.environ["RAY_TMPDIR"] = tmp
    os.environ.pop("RAY_ADDRESS", None)
    try:
        print(json.dumps(asyncio.run(_measure(ns.calls))), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


async def _measure(calls: int) -> dict[str, float]:
    import ray
    from ray import serve

    @serve.deployment
    class Callee:
        async def stream(self, sent_ns: int):
            yield time.time_ns() - sent_ns
            yield 0

    @serve.deployment
    class Caller:
        def __init__(self, callee) -> None:
            self.callee = callee.options(stream=True, _by_reference=False)

        async def run(self, n: int) -> dict[str, float]:
            entered, first = [], []
            for _ in range(n):
                t0 = time.time_ns()
                items = self.callee.stream.remote(t0)
                async for item in items:
                    first.append(time.time_ns() - t0)
                    entered.append(item)
                    break
                async for _ in items:
                    pass
                await asyncio.sleep(0.05)  # one call at a time, as one stream's request is
            return {"calls": n, "entered_ms": round(statistics.median(entered) / 1e6, 3),
                    "first_item_ms": round(statistics.median(first) / 1e6, 3)}

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": 0})
        handle = serve.run(Caller.bind(Callee.bind()), name="serve-hop", route_prefix=None)
        await handle.run.remote(10)  # warm: routers, channels
        return await handle.run.remote(calls)
    finally:
        await serve.shutdown_async()
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
