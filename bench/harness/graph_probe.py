"""python -m bench.harness.graph_probe: the graph bench's eyes inside the Ray cluster, a driver of its own (run
with the cluster's RAY_TMPDIR) that answers one JSON line on stdout for each command line on stdin:

- `stats <deployment>`: the model replica's engine stats (its `run` handle method with a StatsJob: tokens_decoded, steps...)
- `replicas <deployment> <count>`: the pids of `count` replicas of a deployment (its `replica_info` handle
  method, called until that many different replicas answered)

Any failure is answered as {"error": "..."}; an empty line or end of input ends it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.harness.graph_probe")
    p.add_argument("--app", default="llamaray")
    ns = p.parse_args(argv)

    import ray

    ray.init(address="auto", namespace="serve", log_to_driver=False, logging_level="ERROR")
    # On an event loop: with Ray Serve's throughput settings a handle's router runs on the caller's loop.
    asyncio.run(answer_commands(ns.app))
    return 0


async def answer_commands(app: str) -> None:
    from ray import serve

    from app.engine.jobs import StatsJob

    handles: dict[str, Any] = {}
    loop = asyncio.get_running_loop()

    def handle(name: str):
        if name not in handles:
            handles[name] = serve.get_deployment_handle(name, app_name=app)
        return handles[name]

    async def call(name: str, method: str, *args: Any, timeout_s: float = 30.0) -> Any:
        """A handle call, tried again while a new driver's handle does not know the deployment yet."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return await asyncio.wait_for(getattr(handle(name), method).remote(*args), timeout_s)
            except KeyError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    async def replicas(name: str, count: int, timeout_s: float = 30.0) -> list[int]:
        pids: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(pids) < count and time.monotonic() < deadline:
            pids.add(int((await call(name, "replica_info"))["pid"]))
        return sorted(pids)

    print(json.dumps({"ready": True}), flush=True)
    while True:
        words = (await loop.run_in_executor(None, sys.stdin.readline)).split()
        if not words:
            return
        try:
            if words[0] == "stats":
                answer = await call(words[1], "run", StatsJob())
            elif words[0] == "replicas":
                answer = {"pids": await asyncio.wait_for(replicas(words[1], int(words[2])), 60)}
            else:
                answer = {"error": f"unknown command {words[0]!r}"}
        except Exception as exc:  # noqa: BLE001 - answered, the bench decides
            answer = {"error": f"{type(exc).__name__}: {exc!r}"}
        print(json.dumps(answer, default=str), flush=True)


if __name__ == "__main__":
    sys.exit(main())
