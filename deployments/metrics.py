"""Ray Serve metrics for llamaray (they reach Ray's Prometheus endpoint with deployment,
replica and application tags added by Serve). Names are listed in the README."""

from __future__ import annotations

from ray.serve import metrics

from app.observe import RequestRecord

_LATENCY_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300]
_ITL_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28]


class RayRequestObserver:
    """ChatProcessor side: one record per chat completion."""

    def __init__(self) -> None:
        self.requests = metrics.Counter("llamaray_requests_total", "Chat completions by outcome.",
                                        tag_keys=("model", "status", "stream", "error_code"))
        self.ttft = metrics.Histogram("llamaray_time_to_first_token_seconds", "Request start to first token.",
                                      boundaries=_LATENCY_BUCKETS, tag_keys=("model",))
        self.itl = metrics.Histogram("llamaray_inter_token_latency_seconds", "Mean gap between tokens.",
                                     boundaries=_ITL_BUCKETS, tag_keys=("model",))
        self.e2e = metrics.Histogram("llamaray_request_duration_seconds", "Request start to end.",
                                     boundaries=_LATENCY_BUCKETS, tag_keys=("model", "status"))
        self.prompt = metrics.Counter("llamaray_prompt_tokens_total", "Prompt tokens.", tag_keys=("model",))
        self.completion = metrics.Counter("llamaray_completion_tokens_total", "Generated tokens.",
                                          tag_keys=("model",))
        self.cached = metrics.Counter("llamaray_cached_prompt_tokens_total", "Prompt tokens reused from the KV cache.",
                                      tag_keys=("model",))

    def record(self, rec: RequestRecord) -> None:
        model = {"model": rec.model}
        # error_code is "" (no label in Prometheus) unless the request failed: which error, at a glance.
        self.requests.inc(1, {**model, "status": rec.status, "stream": str(rec.stream).lower(),
                              "error_code": rec.error_code or ""})
        self.e2e.observe(rec.duration_s, {**model, "status": rec.status})
        if rec.ttft_s is not None:
            self.ttft.observe(rec.ttft_s, model)
        if rec.itl_s is not None:
            self.itl.observe(rec.itl_s, model)
        if rec.prompt_tokens:
            self.prompt.inc(rec.prompt_tokens, model)
        if rec.completion_tokens:
            self.completion.inc(rec.completion_tokens, model)
        if rec.cached_tokens:
            self.cached.inc(rec.cached_tokens, model)


class EngineGauges:
    """LlamaModel side: sequences running and waiting in this replica, prefix-cache hits."""

    def __init__(self, model: str) -> None:
        self.tags = {"model": model}
        self.running = metrics.Gauge("llamaray_running_sequences", "Sequences decoding in this replica.",
                                     tag_keys=("model",))
        self.waiting = metrics.Gauge("llamaray_waiting_sequences", "Sequences admitted to the replica, not yet in a slot.",
                                     tag_keys=("model",))
        self.cache_hits = metrics.Counter("llamaray_prefix_cache_hits_total",
                                          "Requests that reused a cached prompt prefix.", tag_keys=("model",))

    def update(self, stats: dict) -> None:
        self.running.set(stats["running"], self.tags)
        self.waiting.set(stats["waiting"], self.tags)

    def cache_hit(self) -> None:
        self.cache_hits.inc(1, self.tags)
