"""python -m bench.load.loadtest: drive an OpenAI-compatible chat endpoint with a ramped workload, watch
Serve's replica counts meanwhile, and write a report (report.json + report.png).

  python -m bench.load.loadtest --url http://127.0.0.1:8000/v1 --model smollm2-135m \\
      --ramp "1:30s,1-32:2m,32:1m,32-1:1m"
  python -m bench.load.loadtest --url ... --model ... --mode open --ramp "0.5:30s,0.5-8:3m"

Ramp: comma-separated segments run in order, LEVEL:DURATION (hold) or FROM-TO:DURATION (linear),
LEVEL being the concurrency (--mode closed, whole numbers) or requests/s (--mode open); 0 pauses.
Durations: 500ms, 30s, 2m, 1m30s, 1h; a bare number is seconds.
Ctrl-C once: stop sending and let the requests in flight finish; twice: cancel them. Either way
the report of what ran is written. Exit code 0 whenever the test ran, even with failed requests.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ..loadgen import DEFAULT_PROMPTS, chat_payload, chat_url, stream_chat

from . import report as rep
from .progress import Progress
from .serve_status import DEFAULT_DASHBOARD, ServePoller
from .workload import ARRIVALS, MODES, RampError, Schedule, parse_duration, parse_ramp, run_closed, run_open

DEFAULT_RAMP = {"closed": "1:30s,1-16:2m,16:1m,16-1:1m", "open": "0.2:30s,0.2-4:2m,4:1m,4-0.2:1m"}


@dataclass
class Config:
    url: str
    model: str
    api_key: str | None
    mode: str
    schedule: Schedule
    prompts: list[str]
    prompts_file: str | None
    max_tokens: int
    temperature: float
    seed: int
    out: Path
    serve_dashboard: str | None
    poll_interval_s: float
    request_timeout_s: float
    max_in_flight: int
    arrivals: str
    progress: bool

    @property
    def level_unit(self) -> str:
        return "concurrency" if self.mode == "closed" else "requests/s"

    def to_json(self) -> dict[str, Any]:
        """For the report: everything that shaped the run, but not the API key."""
        return {
            "url": self.url, "model": self.model, "mode": self.mode, "level_unit": self.level_unit,
            "ramp": self.schedule.describe(), "duration_s": self.schedule.duration_s,
            "max_tokens": self.max_tokens, "temperature": self.temperature, "seed": self.seed,
            "n_prompts": len(self.prompts), "prompts_file": self.prompts_file,
            "serve_dashboard": self.serve_dashboard, "poll_interval_s": self.poll_interval_s,
            "request_timeout_s": self.request_timeout_s,
            "max_in_flight": self.max_in_flight if self.mode == "open" else None,
            "arrivals": self.arrivals if self.mode == "open" else None,
        }


def _positive_int(what: str):
    def conv(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what}: {text!r} is not a whole number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{what} must be > 0, got {text!r}")
        return value
    return conv


def _seconds(what: str):
    """A duration such as `1`, `0.5`, `500ms` or `2m`, in seconds, > 0."""
    def conv(text: str) -> float:
        try:
            value = parse_duration(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{what}: {exc}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{what} must be > 0, got {text!r}")
        return value
    return conv


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(prog="python -m bench.load.loadtest", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", required=True)
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                   help="sent as a Bearer token (default: $OPENAI_API_KEY, else none)")
    p.add_argument("--mode", choices=MODES, default="closed",
                   help="closed: a number of users sending back-to-back; open: requests/s")
    p.add_argument("--ramp", default=None,
                   help=f"workload shape (default closed: {DEFAULT_RAMP['closed']!r}, "
                        f"open: {DEFAULT_RAMP['open']!r})")
    p.add_argument("--max-tokens", type=_positive_int("--max-tokens"), default=128)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=0,
                   help="request i sends seed SEED+i; also seeds the open loop's arrival times")
    p.add_argument("--prompts-file", type=Path, default=None,
                   help="one prompt per line (blank lines skipped); default: built-in long-answer prompts")
    p.add_argument("--out", type=Path, default=None,
                   help="report directory (default: loadtest-results/<timestamp>)")
    p.add_argument("--serve-dashboard", default=DEFAULT_DASHBOARD,
                   help="Ray dashboard URL to read replica counts from, or 'none'")
    p.add_argument("--poll-interval", type=_seconds("--poll-interval"), default=1.0,
                   help="seconds between replica polls (default 1)")
    p.add_argument("--request-timeout", type=_seconds("--request-timeout"), default=120.0,
                   help="seconds a request may wait for its connection or next chunk (default 120)")
    p.add_argument("--max-in-flight", type=_positive_int("--max-in-flight"), default=256,
                   help="open loop: arrivals beyond this many running requests are dropped (default 256)")
    p.add_argument("--arrivals", choices=ARRIVALS, default="poisson",
                   help="open loop: Poisson (random) or evenly spaced arrivals")
    p.add_argument("--no-progress", action="store_true",
                   help="no live line; print a status line every 10 s instead")
    ns = p.parse_args(argv)

    try:
        schedule = parse_ramp(ns.ramp or DEFAULT_RAMP[ns.mode], ns.mode)
    except RampError as exc:
        p.error(str(exc))
    prompts = list(DEFAULT_PROMPTS)
    if ns.prompts_file is not None:
        try:
            prompts = [ln.strip() for ln in ns.prompts_file.read_text().splitlines() if ln.strip()]
        except OSError as exc:
            p.error(f"--prompts-file: {exc}")
        if not prompts:
            p.error(f"--prompts-file {ns.prompts_file}: no prompts in it")
    dashboard = None if ns.serve_dashboard.strip().lower() in ("", "none", "off") else ns.serve_dashboard
    out = ns.out or Path("loadtest-results") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Config(
        url=ns.url, model=ns.model, api_key=ns.api_key or None, mode=ns.mode, schedule=schedule,
        prompts=prompts, prompts_file=str(ns.prompts_file) if ns.prompts_file else None,
        max_tokens=ns.max_tokens, temperature=ns.temperature, seed=ns.seed, out=out,
        serve_dashboard=dashboard, poll_interval_s=ns.poll_interval, request_timeout_s=ns.request_timeout,
        max_in_flight=ns.max_in_flight, arrivals=ns.arrivals, progress=not ns.no_progress)


def models_url(base_url: str) -> str:
    return chat_url(base_url).removesuffix("/chat/completions") + "/models"


async def reachable(url: str, headers: dict[str, str]) -> str | None:
    """None if something answers HTTP at the endpoint's host (any status), else why not. A dead URL
    would otherwise show up as minutes of connection errors."""
    try:
        async with httpx.AsyncClient(timeout=10.0, headers=headers) as client:
            await client.get(models_url(url))
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        return f"{type(exc).__name__}: {exc}"
    except httpx.HTTPError:
        pass   # it answered, if oddly; the requests themselves will tell
    return None


@dataclass
class Outcome:
    report: dict[str, Any]
    json_path: Path
    png_path: Path | None
    png_error: str | None


async def execute(cfg: Config, *, stderr=None, install_signals: bool = True) -> Outcome:
    """Run the load test described by `cfg` and write its report."""
    stderr = stderr if stderr is not None else sys.stderr
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    cap = int(cfg.schedule.max_level + 0.5) if cfg.mode == "closed" else cfg.max_in_flight
    client = httpx.AsyncClient(
        headers=headers, timeout=httpx.Timeout(cfg.request_timeout_s, connect=10.0),
        limits=httpx.Limits(max_connections=cap + 4, max_keepalive_connections=cap + 4))
    url = chat_url(cfg.url)
    started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    log = rep.RunLog(t0=time.perf_counter(), schedule=cfg.schedule)
    progress = Progress(log, level_unit=cfg.level_unit, enabled=cfg.progress, stream=stderr)
    stop_sending = asyncio.Event()   # first Ctrl-C: no new requests, let the running ones finish
    stop_watching = asyncio.Event()  # end of run: stop polling and drawing

    async def send(i: int) -> None:
        p = i % len(cfg.prompts)
        payload = chat_payload(cfg.model, cfg.prompts[p], cfg.max_tokens, temperature=cfg.temperature,
                               seed=cfg.seed + i)
        log.on_result(await stream_chat(client, url, payload, index=i, prompt_index=p,
                                        on_start=log.on_start))

    if cfg.mode == "closed":
        driver = run_closed(cfg.schedule, send, stop_sending)
    else:
        driver = run_open(cfg.schedule, send, stop_sending, max_in_flight=cfg.max_in_flight,
                          process=cfg.arrivals, rng=random.Random(cfg.seed), on_drop=log.on_drop)
    poller = ServePoller(cfg.serve_dashboard, cfg.poll_interval_s) if cfg.serve_dashboard else None

    load = asyncio.create_task(driver)
    watchers = [asyncio.create_task(progress.run(stop_watching))]
    if poller is not None:
        watchers.append(asyncio.create_task(poller.run(log.on_replicas, stop_watching)))

    interrupts = 0

    def on_signal(signum: int) -> None:
        nonlocal interrupts
        interrupts += 1
        if signum == signal.SIGINT and interrupts == 1:
            stop_sending.set()
            progress.draining = True
            progress.message(f"interrupted: sending no more; waiting for {len(log.in_flight)} "
                             "request(s) in flight (Ctrl-C again to cancel them)")
        else:
            load.cancel()

    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM) if install_signals else ()
    for sig in signals:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await asyncio.wait({load})
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        if not load.done():   # we ourselves were cancelled
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)
        stop_watching.set()
        await asyncio.gather(*watchers, return_exceptions=True)
        progress.close()
        await client.aclose()
    wall_s = time.perf_counter() - log.t0

    serve = None
    if poller is not None:
        serve = {**poller.status(), "available": bool(log.replica_samples)}
    report = rep.build_report(log, wall_s, config=cfg.to_json(), serve=serve,
                              interrupted=interrupts > 0 or load.cancelled())
    report["started_at"] = started_at
    json_path = rep.write_json(report, cfg.out / "report.json")
    png_path, png_error = None, None
    try:
        png_path = rep.plot(report, cfg.out / "report.png")
    except ImportError:
        png_error = "matplotlib is not installed (pip install matplotlib); no PNG"
    if not load.cancelled() and load.exception() is not None:
        raise load.exception()   # a bug, not a failed request (those are results): after the report
    return Outcome(report, json_path, png_path, png_error)


def _fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def summary_text(outcome: Outcome) -> str:
    r = outcome.report
    t = r["totals"]
    lines = [
        f"load test {'interrupted after' if r['interrupted'] else 'done in'} {r['wall_s']:.1f} s: "
        f"{t['n_requests']} requests, {t['n_ok']} ok, {t['n_failed']} failed"
        + (f", {t['dropped']} dropped (in-flight cap)" if t["dropped"] else "")
        + (f", {t['cancelled']} cancelled" if t["cancelled"] else ""),
        f"  throughput {t['tokens_per_s'] or 0:.1f} tok/s, {t['requests_per_s'] or 0:.2f} req/s; "
        f"TTFT p50/p95 {_fmt_ms(t['ttft_ms']['p50'])}/{_fmt_ms(t['ttft_ms']['p95'])} ms; "
        f"end-to-end p50/p95 {_fmt_ms(t['latency_ms']['p50'])}/{_fmt_ms(t['latency_ms']['p95'])} ms",
    ]
    for reason in t["failed_reasons"]:
        lines.append(f"  failed x{reason['count']}: {reason['outcome']}"
                     + (f" ({reason['error'][:100]})" if reason["error"] else ""))
    if t["max_replicas"]:
        names = rep.short_names(t["max_replicas"])
        lines.append("  max replicas running: "
                     + ", ".join(f"{names[k]} {n}" for k, n in t["max_replicas"].items()))
    elif r["serve"] is not None:
        lines.append(f"  no replica data from {r['serve']['url']}: {r['serve']['last_error'] or 'no deployments'}")
    lines.append(f"  report: {outcome.json_path}" + (f", {outcome.png_path}" if outcome.png_path else ""))
    if outcome.png_error:
        lines.append(f"  {outcome.png_error}")
    return "\n".join(lines)


async def _amain(cfg: Config) -> int:
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    why = await reachable(cfg.url, headers)
    if why is not None:
        print(f"loadtest: cannot reach {cfg.url}: {why}", file=sys.stderr)
        return 2
    print(f"loadtest: {cfg.mode} loop, ramp {cfg.schedule.describe()} ({cfg.schedule.duration_s:g} s), "
          f"model {cfg.model} at {cfg.url}; report in {cfg.out}/", file=sys.stderr)
    outcome = await execute(cfg)
    print(summary_text(outcome))
    return 0


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    try:
        return asyncio.run(_amain(cfg))
    except KeyboardInterrupt:   # Ctrl-C before the load started (during the reachability check)
        return 130


if __name__ == "__main__":
    sys.exit(main())
