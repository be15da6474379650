"""An in-process OTLP/HTTP trace receiver: the spans a collector at `<url>/v1/traces` gets, decoded with
opentelemetry-proto (protobuf ExportTraceServiceRequest, gzip or not). Serves from a thread, so spans
exported by other processes (Ray replicas on this machine) arrive while a test or a benchmark
(`python -m bench.hops`) waits."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse,
)

SERVER, CLIENT = 2, 3  # opentelemetry.proto.trace.v1.Span.SpanKind


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str     # hex
    span_id: str
    parent_id: str    # "" for a root
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    events: tuple[str, ...]
    error: bool       # status ERROR
    event_ns: tuple[int, ...] = ()  # each event's time, in the order of `events`


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class OTLPCollector:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()

    def __enter__(self) -> "OTLPCollector":
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                ok = self.path == "/v1/traces"
                if ok:
                    collector._add(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="otlp-collector", daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _add(self, request: Any) -> None:
        received = []
        for rs in request.resource_spans:
            resource = _attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    received.append(ReceivedSpan(
                        name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(), kind=s.kind, start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano, attributes=_attributes(s.attributes), resource=resource,
                        events=tuple(e.name for e in s.events), error=s.status.code == 2,
                        event_ns=tuple(e.time_unix_nano for e in s.events)))
        with self._lock:
            self.requests += 1
            self.spans.extend(received)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, trace_id: str, done: Callable[[list[ReceivedSpan]], bool],
                 timeout_s: float) -> list[ReceivedSpan]:
        """The trace's spans once `done(spans)` holds; its spans so far when `timeout_s` passes first."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.trace(trace_id)
            if done(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.1)
