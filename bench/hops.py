"""python -m bench.hops: where a streamed request's time to first token goes at one stream, tier by tier and
hop by hop, in `make run`'s shape and in the graph's, beside a bare Ray Serve streaming call on this machine.

    .venv/bin/python -m bench.hops [--servers llamaray,llamaray-graph] [--requests 16] [--rounds 2]
        [--max-tokens 8] [--no-bare] [--out FILE.json]

The servers are the bench's (bench/harness/servers.py: `make run`'s command on configs/local-cpu.yaml +
configs/bench.yaml, the graph with configs/local-graph.yaml too), each with one more overlay that sends their
spans to a collector in this process (app args `tracing`, the OpenTelemetry spans tests/graph/test_tracing.py
checks). They run side by side and take turns (the one not measured is stopped with SIGSTOP), the order
alternating round by round. Each request is one streamed chat completion with a prompt no other request
shares (nothing cached), greedy, one at a time; its phases come from its trace and the client's clock (one
machine, one clock):

- `http_in`: the client's send to the Ingress's server span;
- `to_processor`: the Ingress's span to the processing's (`chat <model>`); in the graph the Ray hop, its
  client span to the ChatProcessor's span, is `hop_processor`;
- `plan`: rendering the prompt and its grammar;
- `to_model`: the processing's span to the model's (`generate <model>`); in the graph the Ray hop is
  `hop_model`;
- `to_queue` and `queue`: the model's span to its queue and the wait for a slot;
- `prefill`: the model's prefill, to its `first_token` event;
- `back`: the `first_token` event to the client reading the first content (the return path: the graph's two
  stream channels and the Ingress's SSE; one event loop in `make run`).

The bare hop (`python -m bench.serve_hop`, a Ray of its own with `make run`'s Ray settings): a replica
calling another's streaming method through a Serve handle, as the graph's tiers call each other, with
nothing of llamaray's in it: Ray Serve's own price for each of the graph's hops.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from .harness.otlp_collector import OTLPCollector, ReceivedSpan
from .harness.run import ROOT, log
from .harness.servers import SERVERS
from .load.loadgen import DEFAULT_PROMPTS

PHASES = ("ttft", "http_in", "to_processor", "hop_processor", "plan", "to_model", "hop_model", "to_queue",
          "queue", "prefill", "back")
INGRESS_SPAN = "POST /v1/chat/completions"
PROCESSOR_HOP_SPAN = "ChatProcessor/stream"


def _ms(a: int, b: int) -> float:
    return round((b - a) / 1e6, 3)


def phases(spans: list[ReceivedSpan], sent_ns: int, first_ns: int) -> dict[str, float | None]:
    """One request's phases in ms (module docstring) from its trace's spans and the client's times (the send,
    the first content read). A hop's phase is None where the shape has no such hop (`make run`)."""
    by_name = {s.name: s for s in spans}

    def named(prefix: str, suffix: str = "") -> ReceivedSpan:
        return next(s for s in spans if s.name.startswith(prefix) and s.name.endswith(suffix))

    ingress, processing, plan = by_name[INGRESS_SPAN], named("chat "), by_name["plan"]
    generate, queue = named("generate "), by_name["queue"]
    first_token = generate.event_ns[generate.events.index("first_token")]
    hop = by_name.get(PROCESSOR_HOP_SPAN)
    model_hop = next((s for s in spans if s.name.endswith("/generate") and s is not generate), None)
    return {
        "ttft": _ms(sent_ns, first_ns),
        "http_in": _ms(sent_ns, ingress.start_ns),
        "to_processor": _ms(ingress.start_ns, processing.start_ns),
        "hop_processor": _ms(hop.start_ns, processing.start_ns) if hop else None,
        "plan": _ms(plan.start_ns, plan.end_ns),
        "to_model": _ms(processing.start_ns, generate.start_ns),
        "hop_model": _ms(model_hop.start_ns, generate.start_ns) if model_hop else None,
        "to_queue": _ms(generate.start_ns, queue.start_ns),
        "queue": _ms(queue.start_ns, queue.end_ns),
        "prefill": _ms(queue.end_ns, first_token),
        "back": _ms(first_token, first_ns),
    }


def medians(rows: list[dict[str, float | None]]) -> dict[str, float | None]:
    """Each phase's median over the requests that have it (None: none has it)."""
    out: dict[str, float | None] = {}
    for name in PHASES:
        values = [r[name] for r in rows if r.get(name) is not None]
        out[name] = round(statistics.median(values), 2) if values else None
    return out


def format_table(results: dict[str, dict[str, float | None]], bare: dict[str, float] | None) -> str:
    """Markdown: one row per server, one column per phase (medians, ms); the bare Serve hop below."""
    head = ["server", "requests", *PHASES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in results.items():
        cells = [name, str(row.get("requests", ""))]
        cells += ["-" if row.get(p) is None else f"{row[p]:.1f}" for p in PHASES]
        lines.append("| " + " | ".join(cells) + " |")
    if bare:
        lines.append("")
        lines.append(f"A bare Ray Serve streaming call between two replicas (`python -m bench.serve_hop`, medians of "
                     f"{bare['calls']}): the callee's method entered {bare['entered_ms']:.2f} ms after `.remote()`, "
                     f"its first item back at {bare['first_item_ms']:.2f} ms.")
    return "\n".join(lines)


def tracing_overlay(url: str, path: Path) -> Path:
    """An overlay that sends the application's spans to `url` (the in-process collector)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"applications": [{"name": "llamaray", "args": {
        "tracing": {"endpoint": url, "service_name": "llamaray-bench-hops"}}}]}, sort_keys=False))
    return path


def _one_request(client: httpx.Client, server: Any, prompt: str, max_tokens: int) -> tuple[str, int, int]:
    """(trace id, send time, first content time) of one greedy streamed chat completion."""
    trace_id = secrets.token_hex(16)
    body = {"model": server.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    headers = {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}
    sent = time.time_ns()
    first = None
    with client.stream("POST", f"{server.base_url}/v1/chat/completions", json=body, headers=headers,
                       timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if first is None and line.startswith("data: {"):
                choices = json.loads(line[6:]).get("choices") or []
                if any((c.get("delta") or {}).get("content") for c in choices):
                    first = time.time_ns()
    if first is None:
        raise RuntimeError(f"{server.name}: a stream without content")
    return trace_id, sent, first


def _trace_done(spans: list[ReceivedSpan]) -> bool:
    names = {s.name for s in spans}
    return INGRESS_SPAN in names and "queue" in names and any(
        n.startswith("generate ") and "first_token" in s.events for n, s in ((s.name, s) for s in spans))


def measure_window(server: Any, collector: OTLPCollector, n: int, tag: str, max_tokens: int) -> list[dict]:
    """`n` requests one after another (after one unmeasured), each request's phases."""
    sent = []
    with httpx.Client() as client:
        _one_request(client, server, f"[{tag} warm-up] {DEFAULT_PROMPTS[0]}", max_tokens)
        for i in range(n):
            prompt = f"[{tag} {i}] {DEFAULT_PROMPTS[i % len(DEFAULT_PROMPTS)]}"
            sent.append(_one_request(client, server, prompt, max_tokens))
    rows = []
    for trace_id, sent_ns, first_ns in sent:
        spans = collector.wait_for(trace_id, _trace_done, timeout_s=30)
        try:
            rows.append(phases(spans, sent_ns, first_ns))
        except (KeyError, StopIteration, ValueError) as exc:
            log(f"{server.name}: trace {trace_id} incomplete ({exc!r}); left out")
    return rows


def bare_hop(calls: int) -> dict[str, float]:
    """`python -m bench.serve_hop` in a process (and a Ray) of its own: its JSON line."""
    out = subprocess.run([sys.executable, "-m", "bench.serve_hop", "--calls", str(calls)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hops")
    p.add_argument("--servers", default="llamaray,llamaray-graph")
    p.add_argument("--requests", type=int, default=16, help="measured requests per server and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--no-bare", action="store_true", help="skip the bare Serve hop")
    p.add_argument("--out", type=Path, default=ROOT / "build" / "bench-hops.json")
    ns = p.parse_args(argv)
    names = [s for s in ns.servers.split(",") if s]
    unknown = [s for s in names if s not in SERVERS or not s.startswith("llamaray")]
    if unknown:
        p.error(f"not llamaray servers of bench/harness/servers.py: {unknown}")

    log_dir = ROOT / "build" / "bench-hops-logs"
    rows: dict[str, list[dict]] = {name: [] for name in names}
    # The replicas' span batches leave at OpenTelemetry's pace (every 5 s): exporting more often takes the GIL from
    # the replica's threads often enough to show in the phases (`queue` grew by ~4 ms at a batch every 0.2 s).
    os.environ.pop("OTEL_BSP_SCHEDULE_DELAY", None)
    with OTLPCollector() as collector:
        overlay = tracing_overlay(collector.url, ROOT / "build" / "bench-hops-tracing.yaml")
        servers = {}
        try:
            for name in names:
                server = SERVERS[name](log_dir)
                server.overlays = (*server.overlays, str(overlay.relative_to(ROOT)))
                server.start()
                server.pause()
                servers[name] = server
            for rnd in range(ns.rounds):
                for name in (names if rnd % 2 == 0 else names[::-1]):
                    for other in servers.values():
                        other.pause()
                    servers[name].resume()
                    got = measure_window(servers[name], collector, ns.requests, f"{name} {rnd}", ns.max_tokens)
                    rows[name] += got
                    log(f"round {rnd} {name}: {medians(got)}")
        finally:
            for server in servers.values():
                server.resume()
            for server in servers.values():
                server.stop()
    results = {name: {"requests": len(r), **medians(r)} for name, r in rows.items()}
    bare = None if ns.no_bare else bare_hop(100)
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps({"command": " ".join(sys.argv), "results": results, "bare_hop": bare,
                                  "rows": rows}, indent=1))
    print(format_table(results, bare))
    return 0


if __name__ == "__main__":
    sys.exit(main())
