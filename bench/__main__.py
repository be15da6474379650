"""python -m bench: llamaray against llama.cpp's llama-server and llama-cpp-python's server.

llamaray runs in two shapes: `llamaray`, as `make run` serves it (one Ingress replica renders, parses and
runs the engine: no Ray hop per streamed item), and `llamaray-graph`, the cluster's three deployments
(Ingress -> ChatProcessor -> LlamaModel, configs/local-graph.yaml: two Ray hops per streamed item) on the
same machine, threads and slots. Same bundled model, same thread count, same llama.cpp version
(llama-server is built from the llama.cpp vendored in the installed llama-cpp-python's sdist). Each level
is bench.load.loadgen's closed loop at one concurrency (one warm-up request first).

The servers compared with the targets (`--interleave`, default llamaray, llamaray-graph and llama-server)
run side by side and take turns level by level: while one is measured, every process of the others (Ray's
included) is stopped (SIGSTOP), so it takes no CPU, and each level of one server runs within a minute
of the same level of the other. This machine's speed moves by 10% and more over minutes; a server
measured minutes after the other could win or lose by that alone. Every round starts the servers
afresh (nothing cached from an earlier round) and alternates which goes first; each row pools its
rounds. `--turns N` splits each level of a round into N shorter turns, the servers alternating who goes first
at each: the machine's speed flips between regimes ~15% apart that last about a minute (docs/benchmarks.md),
and turns of a few seconds put every server in each regime alike. The other servers run alone afterwards, one round,
started and stopped in turn. `make bench` runs `--rounds 2 --turns 4`.
Prints one table and writes <out>/bench.json, <out>/bench-requests.json and <out>/bench.png;
server logs go to <out>/logs/.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .harness.bundled import bundled_model_path
from .harness.procs import CpuMeter, wait_until_quiet
from .harness.run import ROOT, comma_names, log, start_run
from .harness.servers import (
    CTX_PER_SEQ,
    N_PARALLEL,
    N_THREADS,
    SERVERS,
    ensure_llama_server,
    llama_cpp_python_version,
)
from .load.loadgen import DEFAULT_PROMPTS, run_closed_loop, summarize
from .reports import bench_report as report

SEED_BASE = 1000
WARMUP_INDEX = 10_000   # the warm-up request's index (prompt and seed), outside the measured ones


def requests_for(concurrency: int, fixed: int | None) -> int:
    """Enough requests for a level to take ~20-40 s here: 24 at c=1 and c=4, 3 rounds at c=16."""
    return fixed if fixed else max(24, 3 * concurrency)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default="llamaray,llamaray-graph,llama-server,llama-cpp-python",
                   type=comma_names(SERVERS),
                   help="comma-separated, from: " + ", ".join(SERVERS) + " (llamaray: `make run`'s shape, one "
                        "Ingress replica running everything; llamaray-graph: the cluster's three deployments)")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated closed-loop levels")
    p.add_argument("--requests-per-level", type=int, default=None,
                   help="requests per level (default: max(24, 3 * concurrency))")
    p.add_argument("--interleave", default="llamaray,llamaray-graph,llama-server",
                   help="servers (of --servers) that run side by side and take turns level by level, the "
                        "idle ones stopped; '' runs every server alone")
    p.add_argument("--rounds", type=int, default=1,
                   help="times each level of an interleaved server is measured (the order alternates) or, "
                        "with --interleave '', each server (forward, then backward, ...); each row pools "
                        "its rounds' requests (tok/s over their summed wall time)")
    p.add_argument("--turns", type=int, default=1,
                   help="turns per level in each round of interleaved servers: the level's requests split into "
                        "that many turns (each at least `concurrency` requests), the servers taking turns at each "
                        "before the next level")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    p.add_argument("--quiet-wait", type=float, default=180.0,
                   help="before each level, wait up to this many seconds for other processes to use "
                        "< 0.25 cores (on a shared machine they distort llama.cpp's numbers)")
    p.add_argument("--extra-body", default=None,
                   help="a JSON object (or @FILE) merged into every request: a response_format, tools and "
                        "tool_choice, or a grammar (`python -m bench.structured --body json-small` prints one)")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results")
    ns = p.parse_args(argv)
    if ns.extra_body:
        text = Path(ns.extra_body[1:]).read_text() if ns.extra_body.startswith("@") else ns.extra_body
        ns.extra_body = json.loads(text)
        if not isinstance(ns.extra_body, dict):
            p.error("--extra-body must be a JSON object")
    ns.concurrency = [int(c) for c in ns.concurrency.split(",") if c.strip()]
    wanted = comma_names(SERVERS)(ns.interleave) if ns.interleave.strip() else []
    ns.interleave = [n for n in ns.servers if n in wanted]
    if len(ns.interleave) < 2:   # nothing to take turns with
        ns.interleave = []
    if ns.rounds < 1 or ns.turns < 1:
        p.error("--rounds and --turns must be at least 1")
    return ns


def run_order(servers: list[str], rounds: int) -> list[tuple[int, str]]:
    """(round, server) in the order they run: forward in even rounds, backward in odd ones."""
    return [(k, name) for k in range(rounds) for name in (servers if k % 2 == 0 else servers[::-1])]


def turn_order(servers: list[str], concurrency: list[int], round_: int,
               turns: int = 1) -> list[tuple[int, int, str]]:
    """(concurrency, turn, server) for one round of servers taking turns: at each level every server runs
    once a turn, `turns` times, first in one order, at the next turn, level or round in the other."""
    return [(c, t, name) for j, c in enumerate(concurrency) for t in range(turns)
            for name in (servers if (round_ + j + t) % 2 == 0 else servers[::-1])]


def level_requests(ns, c: int) -> int:
    """Requests a level of one round sends, over all its turns (servers that run alone take no turns)."""
    return turn_size(ns, c) * (ns.turns if ns.interleave else 1)


def turn_size(ns, c: int) -> int:
    fixed = ns.requests_per_level
    return turn_requests(c, fixed, ns.turns) if ns.interleave else requests_for(c, fixed)


def turn_requests(c: int, fixed: int | None, turns: int) -> int:
    """Requests of one turn: the level's, split into `turns`, but never fewer than the streams kept going."""
    return max(c, -(-requests_for(c, fixed) // turns))


def pool_rounds(levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One level per (server, concurrency), in first-run order: its rounds' requests summarized
    together over their summed wall time, cores used averaged by wall time, and each round's tok/s."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for lv in levels:
        groups.setdefault((lv["server"], lv["concurrency"]), []).append(lv)
    pooled = []
    for (server, c), group in groups.items():
        walls = [lv["summary"]["wall_s"] for lv in group]
        summary = summarize([r for lv in group for r in lv["results"]], sum(walls))
        cpus = [lv["cpu"] for lv in group if lv.get("cpu")]
        cpu = None
        if cpus:
            weights = [lv["summary"]["wall_s"] for lv in group if lv.get("cpu")]
            cpu = {k: round(sum(x[k] * w for x, w in zip(cpus, weights)) / sum(weights), 2) for k in cpus[0]}
        pooled.append({"server": server, "concurrency": c, "summary": summary, "cpu": cpu,
                       "tokens_per_s_rounds": [round(lv["summary"]["tokens_per_s"] or 0.0, 1) for lv in group]})
    return pooled


def machine_info() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": cpu, "platform": platform.platform(),
            "python": platform.python_version()}


def llama_server_version(binary: Path) -> list[str] | str:
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
        return (out.stdout + out.stderr).strip().splitlines()[-2:]
    except Exception as exc:  # noqa: BLE001 - informational only
        return f"? ({exc})"


async def bench_server(server, ns, round_: int = 0) -> list[dict[str, Any]]:
    return [await bench_level(server, ns, c, round_) for c in ns.concurrency]


async def bench_level(server, ns, c: int, round_: int, turn: int = 0) -> dict[str, Any]:
    n = turn_size(ns, c)
    common = dict(max_tokens=ns.max_tokens, temperature=ns.temperature, timeout_s=ns.timeout, extra=ns.extra_body)
    quiet = wait_until_quiet(server.session_id, ns.quiet_wait)
    [warm] = await run_closed_loop(server.base_url, server.model, 1, 1, DEFAULT_PROMPTS,
                                   seed_base=SEED_BASE, first_index=WARMUP_INDEX, **common)
    log(f"{server.name} c={c}: warm-up {warm.outcome} ({warm.completion_tokens} tokens, "
        f"{warm.latency_s:.2f} s); {n} requests")
    meter = CpuMeter(server.session_id)
    t0 = time.perf_counter()
    # Turn t sends requests t*n .. t*n+n-1: over its turns a level sends what one long turn would.
    results = await run_closed_loop(server.base_url, server.model, c, n, DEFAULT_PROMPTS,
                                    seed_base=SEED_BASE, first_index=turn * n, **common)
    wall = time.perf_counter() - t0
    cpu = meter.read()
    summary = summarize(results, wall)
    log(f"{server.name} c={c}: {summary['tokens_per_s']:.1f} tok/s, TTFT p50 "
        f"{summary['ttft_ms']['p50'] or float('nan'):.0f} ms, {summary['n_failed']} failed/cut, "
        f"{wall:.1f} s; cores used: server {cpu['server_cores']}, load generator "
        f"{cpu['loadgen_cores']}, other processes {cpu['other_cores']}")
    return {"server": server.name, "concurrency": c, "round": round_, "turn": turn, "summary": summary,
            "cpu": cpu, "other_load_before": quiet["other_cores"], "warmup": warm.to_dict(), "results": results}


def start_server(name: str, log_dir: Path, meta: dict[str, Any]):
    """A started server of that name, its start-up time and command recorded in `meta`."""
    server = SERVERS[name](log_dir)
    info = meta["servers"].setdefault(name, {"log": str(server.log_path), "startup_s": []})
    t0 = time.monotonic()
    try:
        server.start()
    except BaseException:
        server.stop()   # whatever it had started
        raise
    finally:
        info.update(command=server.cmdline, base_url=server.base_url, model=server.model)
    info["startup_s"].append(round(time.monotonic() - t0, 1))
    return server


def _failed(name: str, exc: Exception, failures: dict[str, str]) -> None:
    failures[name] = f"not measured: {type(exc).__name__}: {exc}".splitlines()[0]
    log(f"{name} failed: {exc}")


def run_alone(names: list[str], rounds: int, ns, log_dir: Path, meta: dict[str, Any],
              failures: dict[str, str]) -> list[dict[str, Any]]:
    """Each server started, measured at every level and stopped in turn (`run_order`)."""
    levels: list[dict[str, Any]] = []
    for round_, name in run_order(names, rounds):
        if name in failures:
            continue
        server = None
        try:
            server = start_server(name, log_dir, meta)
            levels += asyncio.run(bench_server(server, ns, round_))
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001 - one broken server must not hide the others
            _failed(name, exc, failures)
        finally:
            if server is not None:
                log(f"stopping {name}")
                server.stop()
    return levels


def run_interleaved(ns, log_dir: Path, meta: dict[str, Any], failures: dict[str, str]) -> list[dict[str, Any]]:
    """Each round: the `--interleave` servers started together (fresh, as a round of `run_alone` starts
    them: no prompt cached from an earlier round), measured in `turn_order`, each resumed for its level
    while the others stay paused, then stopped."""
    levels: list[dict[str, Any]] = []
    for round_ in range(ns.rounds):
        live: dict[str, Any] = {}
        try:
            for name in ns.interleave:
                if name in failures:
                    continue
                try:
                    live[name] = start_server(name, log_dir, meta)
                except Exception as exc:  # noqa: BLE001 - one broken server must not hide the others
                    _failed(name, exc, failures)
                    continue
                live[name].pause()   # so that it takes nothing from the next one's start-up
            for c, turn, name in turn_order(list(live), ns.concurrency, round_, ns.turns):
                if name in failures:   # failed at an earlier level
                    continue
                server = live[name]
                server.resume()
                try:
                    levels.append(asyncio.run(bench_level(server, ns, c, round_, turn)))
                except KeyboardInterrupt:
                    raise
                except Exception as exc:  # noqa: BLE001
                    _failed(name, exc, failures)
                finally:
                    server.pause()
        finally:
            for name, server in live.items():
                log(f"stopping {name}")
                server.stop()
    return levels


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    out: Path = ns.out
    log_dir = start_run(out)

    model = bundled_model_path()
    meta: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "model": str(model),
        "llama_cpp_python": llama_cpp_python_version(),
        "n_threads": N_THREADS, "n_parallel": N_PARALLEL, "ctx_per_sequence": CTX_PER_SEQ,
        "workload": {"kind": "closed loop, streaming chat", "concurrency": ns.concurrency, "rounds": ns.rounds,
                     "turns": ns.turns,
                     "taking_turns": ns.interleave or None,
                     "requests_per_level": {c: level_requests(ns, c) for c in ns.concurrency},
                     "max_tokens": ns.max_tokens, "temperature": ns.temperature, "extra_body": ns.extra_body,
                     "seeds": f"{SEED_BASE} + request index", "prompts": len(DEFAULT_PROMPTS),
                     "warmup": "1 request before each level",
                     "cpu": "cores used during each level by the server's processes, the load generator "
                            "and other processes (other_cores > ~0.2: another job competed for the CPUs)",
                     "tokens_per_s": "completion tokens of all streams (also cut ones) / level wall time",
                     "itl": "(last content chunk - first content chunk) / (completion_tokens - 1)"},
        "servers": {},
    }
    if "llama-server" in ns.servers:   # build before anything runs, so it never overlaps a level
        binary = ensure_llama_server(log_dir)
        meta["llama_server_version"] = llama_server_version(binary)

    levels: list[dict[str, Any]] = []
    failures: dict[str, str] = {}
    alone = [n for n in ns.servers if n not in ns.interleave]
    try:
        if ns.interleave:
            levels += run_interleaved(ns, log_dir, meta, failures)
        levels += run_alone(alone, 1 if ns.interleave else ns.rounds, ns, log_dir, meta, failures)
    except KeyboardInterrupt:
        log("interrupted; servers stopped, writing what was measured")
        failures["interrupted"] = "the run was interrupted; the table is partial"

    # rows in --servers order, then by concurrency (interleaved levels run in either order)
    table = report.rows(sorted(pool_rounds(levels), key=lambda lv: (ns.servers.index(lv["server"]),
                                                                      lv["concurrency"])))
    # make run's shape against every peer; the graph against the peers other than make run's shape
    ratio_rows = report.ratios(table) + report.ratios(table, ours="llamaray-graph", skip=("llamaray",))
    text = report.format_table(table, ratio_rows, failures)
    print(text, flush=True)
    json_path, png_path = out / "bench.json", out / "bench.png"
    report.write_json(json_path, {**meta, "table": table, "ratios": ratio_rows, "failures": failures,
                                  "levels": [{k: v for k, v in lv.items() if k != "results"} for lv in levels]})
    report.write_json(out / "bench-requests.json",
                      {"levels": [{"server": lv["server"], "concurrency": lv["concurrency"], "round": lv["round"],
                                   "requests": [r.to_dict() for r in lv["results"]]} for lv in levels]})
    if table:
        report.write_chart(png_path, table, f"SmolLM2-135M Q4_1, {os.cpu_count()} CPUs, {N_THREADS} threads, "
                                            f"max_tokens {ns.max_tokens}, llama-cpp-python "
                                            f"{meta['llama_cpp_python']} ({meta['date']})")
    print(f"\nwrote {json_path}" + (f" and {png_path}" if table else ""), flush=True)
    return 1 if failures or not table else 0


if __name__ == "__main__":
    sys.exit(main())
