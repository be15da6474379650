"""Ray Serve metrics for llamaray. They reach Ray's Prometheus endpoint with a `ray_` prefix (counters with a
`_total` suffix) and the deployment, replica and application tags Serve adds. docs/operations.md lists them;
deploy/grafana/llamaray.json charts them.

Two families:
- `llamaray_*`: each API request as the processing saw it (protocol, status, error code), and engine gauges.
- `vllm_*`: each generation as its model replica saw it, under the names and labels (`model_name`, `engine`) that
  vLLM's Ray stat logger exports (`vllm:x` becomes `ray_vllm_x`), so Ray Serve LLM's Grafana dashboard and its
  Prometheus-driven autoscaling policies (p99 of `ray_vllm_time_to_first_token_seconds`, running plus waiting
  requests, prefix-cache hit rate) read llamaray's model replicas as they read vLLM's. Each choice counts as one
  request, as vLLM counts the n children of a request.
"""

from __future__ import annotations

import functools
from typing import Any

from ray.serve import metrics

from app.engine.timeline import Timeline
from app.observe.request_records import RequestRecord

_LATENCY_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300]
_ITL_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28]

# vLLM's buckets (vllm/v1/metrics/loggers.py), so percentiles read the same on either server.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0]
# vLLM's 1-2-5 series up to the model's context; here one series for every model of a process, to 200k tokens.
TOKEN_BUCKETS = [float(m * 10 ** e) for e in range(6) for m in (1, 2, 5) if m * 10 ** e <= 200_000]

# `adapter`: the LoRA adapters a request decoded under ("" for the base model), beside its base `model`.
MODEL = ("model", "adapter")
REPLICA = ("model",)  # a model replica's engine gauges: all its adapters together
VLLM = ("model_name", "engine")  # vLLM's labels; `engine` is "0" (one engine per model in a replica)

# name -> (kind, description, buckets, tags): every metric this module exports.
METRICS: dict[str, tuple[str, str, list[float] | None, tuple[str, ...]]] = {
    "llamaray_requests_total": ("counter", "API requests by protocol and outcome.", None,
                                ("model", "adapter", "protocol", "status", "stream", "error_code")),
    "llamaray_request_duration_seconds": ("histogram", "Request start to end.", _LATENCY_BUCKETS,
                                          ("model", "adapter", "status")),
    "llamaray_time_to_first_token_seconds": ("histogram", "Request start to first token.", _LATENCY_BUCKETS, MODEL),
    "llamaray_inter_token_latency_seconds": ("histogram", "Mean gap between tokens.", _ITL_BUCKETS, MODEL),
    "llamaray_prompt_tokens_total": ("counter", "Prompt tokens.", None, MODEL),
    "llamaray_completion_tokens_total": ("counter", "Generated tokens.", None, MODEL),
    "llamaray_cached_prompt_tokens_total": ("counter", "Prompt tokens reused from the KV cache.", None, MODEL),
    "llamaray_tenant_requests_total": ("counter", "Requests by key (its name in the keys file) and model.", None,
                                       ("key", "model")),
    "llamaray_tenant_tokens_total": ("counter", "Tokens by key and model: prompt, cached (of the prompt), "
                                     "completion.", None, ("key", "model", "kind")),
    "llamaray_tenant_rate_limited_total": ("counter", "Requests refused by a key's limits (429), by reason: "
                                           "requests, tokens, concurrency, budget.", None, ("key", "reason")),
    "llamaray_tenant_ledger_degraded": ("gauge", "1 while the shared tenant ledger is unreachable and this replica "
                                        "enforces each key's limits alone.", None, ()),
    "llamaray_running_sequences": ("gauge", "Sequences decoding in this replica.", None, REPLICA),
    "llamaray_waiting_sequences": ("gauge", "Sequences admitted to the replica, not yet in a slot.", None, REPLICA),
    "llamaray_prefix_cache_hits_total": ("counter", "Requests that reused a cached prompt prefix.", None, REPLICA),
    "llamaray_kv_tier_hits_total": ("counter", "Prompts whose stored prefix was read from a persistent KV tier "
                                    "(disk, cluster).", None, REPLICA + ("tier",)),
    "llamaray_kv_tier_misses_total": ("counter", "Lookups a persistent KV tier had nothing for.", None, REPLICA + ("tier",)),
    "llamaray_kv_tier_read_bytes_total": ("counter", "Bytes of states read from a KV tier.", None, REPLICA + ("tier",)),
    "llamaray_kv_tier_read_seconds_total": ("counter", "Time spent reading states from a KV tier.", None,
                                            REPLICA + ("tier",)),
    "llamaray_kv_tier_saves_total": ("counter", "States written to a KV tier.", None, REPLICA + ("tier",)),
    "llamaray_kv_tier_save_seconds_total": ("counter", "Time spent writing states to a KV tier (in the background).",
                                            None, REPLICA + ("tier",)),
    "llamaray_kv_tier_errors_total": ("counter", "Failed reads, writes and scans of a KV tier (it is set aside for a "
                                      "while).", None, REPLICA + ("tier",)),
    "llamaray_kv_tier_refused_total": ("counter", "Stored entries found unusable (truncated, corrupted, foreign) and "
                                       "removed.", None, REPLICA + ("tier",)),
    "llamaray_kv_tier_stored_bytes": ("gauge", "Bytes of states a KV tier holds for the model, as this replica "
                                      "indexed them.", None, REPLICA + ("tier",)),
    "llamaray_pool_loads_total": ("counter", "Models a pool replica loaded (outcome ok) or failed to load (failed).",
                                  None, ("pool", "model", "outcome")),
    "llamaray_pool_evictions_total": ("counter", "Models a pool replica unloaded: lru (to make room), idle "
                                      "(idle_unload_s), admin (an unload route), shutdown.", None, ("pool", "model", "reason")),
    "llamaray_pool_load_seconds": ("histogram", "Time to load a pooled model.", _LATENCY_BUCKETS, ("pool",)),
    "llamaray_pool_room_wait_seconds": ("histogram", "Time a request for a model its pool replica did not hold "
                                        "waited for one of the models held to go idle (room_wait_s), before its "
                                        "load or its 503.", _LATENCY_BUCKETS, ("pool",)),
    "llamaray_pool_claims_total": ("counter", "Held models a request waiting for room claimed (claim_after_s): new "
                                   "requests for it wait, and it is unloaded once the requests on it end.", None,
                                   ("pool", "model")),
    "llamaray_pool_loaded_models": ("gauge", "Models a pool replica holds (loaded or loading).", None, ("pool",)),
    "llamaray_batch_lines": ("gauge", "Lines of batch jobs by model: queued (not yet sent) and running (sent, not "
                             "answered).", None, ("model", "state")),
    "llamaray_batch_lines_total": ("counter", "Lines of batch jobs answered, by model and outcome (succeeded, "
                                   "errored).", None, ("model", "outcome")),
    "vllm_num_requests_running": ("gauge", "Requests in the engine's slots (each choice counts).", None, VLLM),
    "vllm_num_requests_waiting": ("gauge", "Requests waiting for a slot.", None, VLLM),
    "vllm_prompt_tokens": ("counter", "Prompt tokens of the requests admitted.", None, VLLM),
    "vllm_generation_tokens": ("counter", "Generated tokens.", None, VLLM),
    "vllm_prefix_cache_queries": ("counter", "Prompt tokens looked up in the prefix cache.", None, VLLM),
    "vllm_prefix_cache_hits": ("counter", "Prompt tokens whose KV was reused (cached_tokens).", None, VLLM),
    "vllm_request_success": ("counter", "Finished requests by finish reason (stop, length, abort, error).", None,
                             VLLM + ("finished_reason",)),
    "vllm_request_prompt_tokens": ("histogram", "Prompt tokens per request.", TOKEN_BUCKETS, VLLM),
    "vllm_request_generation_tokens": ("histogram", "Generated tokens per request.", TOKEN_BUCKETS, VLLM),
    "vllm_time_to_first_token_seconds": ("histogram", "Arrival at the model replica to first token.", TTFT_BUCKETS,
                                         VLLM),
    "vllm_request_time_per_output_token_seconds": ("histogram", "Decode time per generated token after the first.",
                                                   TPOT_BUCKETS, VLLM),
    "vllm_e2e_request_latency_seconds": ("histogram", "Arrival at the model replica to the end.",
                                         REQUEST_LATENCY_BUCKETS, VLLM),
    "vllm_request_queue_time_seconds": ("histogram", "Waiting for a slot (submitted -> admitted).",
                                        REQUEST_LATENCY_BUCKETS, VLLM),
    "vllm_request_inference_time_seconds": ("histogram", "Admitted -> end.", REQUEST_LATENCY_BUCKETS, VLLM),
    "vllm_request_prefill_time_seconds": ("histogram", "Admitted -> first token.", REQUEST_LATENCY_BUCKETS, VLLM),
    "vllm_request_decode_time_seconds": ("histogram", "First token -> end.", REQUEST_LATENCY_BUCKETS, VLLM),
    "vllm_spec_decode_num_drafts": ("counter", "Speculative drafts verified (one per sequence and step that drafted).",
                                    None, VLLM),
    "vllm_spec_decode_num_draft_tokens": ("counter", "Draft tokens verified.", None, VLLM),
    "vllm_spec_decode_num_accepted_tokens": ("counter", "Draft tokens accepted.", None, VLLM),
}


@functools.cache
def metric(name: str) -> Any:
    """The Ray metric `name` of METRICS, made once per process (a replica may host several models)."""
    kind, doc, buckets, tags = METRICS[name]
    if kind == "counter":
        return metrics.Counter(name, doc, tag_keys=tags)
    if kind == "gauge":
        return metrics.Gauge(name, doc, tag_keys=tags)
    return metrics.Histogram(name, doc, boundaries=buckets, tag_keys=tags)


class RayRequestObserver:
    """The processing's side (the ChatProcessor, or the Ingress with topology single): one record per request."""

    def record(self, rec: RequestRecord) -> None:
        model = {"model": rec.model, "adapter": rec.adapter}
        # error_code is "" (no label in Prometheus) unless the request failed: which error, at a glance.
        metric("llamaray_requests_total").inc(1, {**model, "protocol": rec.protocol, "status": rec.status,
                                                  "stream": str(rec.stream).lower(), "error_code": rec.error_code or ""})
        metric("llamaray_request_duration_seconds").observe(rec.duration_s, {**model, "status": rec.status})
        if rec.ttft_s is not None:
            metric("llamaray_time_to_first_token_seconds").observe(rec.ttft_s, model)
        if rec.itl_s is not None:
            metric("llamaray_inter_token_latency_seconds").observe(rec.itl_s, model)
        for name, value in (("llamaray_prompt_tokens_total", rec.prompt_tokens),
                            ("llamaray_completion_tokens_total", rec.completion_tokens),
                            ("llamaray_cached_prompt_tokens_total", rec.cached_tokens)):
            if value:
                metric(name).inc(value, model)
        if rec.tenant:  # key names come from the keys file: as many series as keys x models, no more
            key = {"key": rec.tenant, "model": rec.model}
            metric("llamaray_tenant_requests_total").inc(1, key)
            for kind, value in (("prompt", rec.prompt_tokens), ("cached", rec.cached_tokens),
                                ("completion", rec.completion_tokens)):
                if value:
                    metric("llamaray_tenant_tokens_total").inc(value, {**key, "kind": kind})


class BatchMetrics:
    """The batch runner's events (app/batches/runner.py BatchEvents) as metrics: its lines queued and running per
    model (gauges kept by the one runner of the app), and answered by outcome."""

    def __init__(self) -> None:
        self.levels: dict[tuple[str, str], int] = {}

    def _move(self, model: str, state: str, delta: int) -> None:
        level = self.levels[(model, state)] = self.levels.get((model, state), 0) + delta
        metric("llamaray_batch_lines").set(level, {"model": model, "state": state})

    def queued(self, model: str, delta: int) -> None:
        self._move(model, "queued", delta)

    def running(self, model: str, delta: int) -> None:
        self._move(model, "running", delta)

    def ended(self, model: str, outcome: str) -> None:
        metric("llamaray_batch_lines_total").inc(1, {"model": model, "outcome": outcome})


class TenantMetrics:
    """The tenant gate's events (app/serving/tenancy.py TenantEvents) as metrics."""

    def refused(self, tenant: str, reason: str) -> None:
        metric("llamaray_tenant_rate_limited_total").inc(1, {"key": tenant, "reason": reason})

    def degraded(self, degraded: bool) -> None:
        metric("llamaray_tenant_ledger_degraded").set(1 if degraded else 0)


class EngineGauges:
    """The model's side (a LlamaModel replica, or the Ingress hosting the engine): sequences running and waiting,
    prefix-cache hits, and each generation under vLLM's names."""

    def __init__(self, model: str) -> None:
        self.tags = {"model": model}
        self.vllm_tags = {"model_name": model, "engine": "0"}
        self._spec_seen: dict[str, int] = {}  # the engine's speculative totals at the last update
        self._kv_seen: dict[tuple[str, str], float] = {}  # each KV tier's totals at the last update

    def update(self, stats: dict) -> None:
        metric("llamaray_running_sequences").set(stats["running"], self.tags)
        metric("llamaray_waiting_sequences").set(stats["waiting"], self.tags)
        metric("vllm_num_requests_running").set(stats["running"], self.vllm_tags)
        metric("vllm_num_requests_waiting").set(stats["waiting"], self.vllm_tags)
        for name, total in (stats.get("spec_decode") or {}).items():  # the engine's totals, counted as increments
            grown = total - self._spec_seen.get(name, 0)
            if grown > 0:
                metric(f"vllm_spec_decode_{name}").inc(grown, self.vllm_tags)
            self._spec_seen[name] = total
        for tier, counts in ((stats.get("kv_tiers") or {}).get("tiers") or {}).items():
            tags = {**self.tags, "tier": tier}
            metric("llamaray_kv_tier_stored_bytes").set(counts["bytes"], tags)
            for name, key in (("hits_total", "hits"), ("misses_total", "misses"), ("read_bytes_total", "read_bytes"),
                              ("read_seconds_total", "read_s"), ("saves_total", "saves"),
                              ("save_seconds_total", "save_s"), ("errors_total", "errors"),
                              ("refused_total", "refused")):
                grown = counts[key] - self._kv_seen.get((tier, key), 0)
                if grown > 0:
                    metric(f"llamaray_kv_tier_{name}").inc(grown, tags)
                self._kv_seen[(tier, key)] = counts[key]

    def cache_hit(self) -> None:
        metric("llamaray_prefix_cache_hits_total").inc(1, self.tags)

    def record(self, timeline: Timeline) -> None:
        """A generation that ended (or was abandoned): each admitted choice, as vLLM records a finished request."""
        tags = self.vllm_tags
        for c in timeline.stats():
            metric("vllm_request_success").inc(1, {**tags, "finished_reason": c.finish_reason})
            for name, count in (("vllm_prompt_tokens", c.prompt_tokens), ("vllm_generation_tokens", c.generation_tokens),
                                ("vllm_prefix_cache_queries", c.prompt_tokens),
                                ("vllm_prefix_cache_hits", c.cached_tokens)):
                if count:
                    metric(name).inc(count, tags)
            for name, value in (("vllm_request_prompt_tokens", c.prompt_tokens),
                                ("vllm_request_generation_tokens", c.generation_tokens),
                                ("vllm_e2e_request_latency_seconds", c.e2e_s),
                                ("vllm_request_queue_time_seconds", c.queue_s),
                                ("vllm_request_inference_time_seconds", c.inference_s),
                                ("vllm_time_to_first_token_seconds", c.ttft_s),
                                ("vllm_request_prefill_time_seconds", c.prefill_s),
                                ("vllm_request_decode_time_seconds", c.decode_s),
                                ("vllm_request_time_per_output_token_seconds", c.tpot_s)):
                if value is not None:
                    metric(name).observe(value, tags)


class PoolMetrics:
    """A pool replica's loads, failed loads and evictions (app/pools/manager.py's events)."""

    def __init__(self, pool: str) -> None:
        self.pool = pool

    def record(self, event: str, model: str, detail: Any, held: int) -> None:
        tags = {"pool": self.pool, "model": model}
        if event == "loaded":
            metric("llamaray_pool_loads_total").inc(1, {**tags, "outcome": "ok"})
            metric("llamaray_pool_load_seconds").observe(float(detail), {"pool": self.pool})
        elif event == "load_failed":
            metric("llamaray_pool_loads_total").inc(1, {**tags, "outcome": "failed"})
        elif event == "evicted":
            metric("llamaray_pool_evictions_total").inc(1, {**tags, "reason": str(detail)})
        elif event == "room_waited":
            metric("llamaray_pool_room_wait_seconds").observe(float(detail), {"pool": self.pool})
            return
        elif event == "claimed":
            metric("llamaray_pool_claims_total").inc(1, tags)
            return
        metric("llamaray_pool_loaded_models").set(held, {"pool": self.pool})
