"""deploy/grafana/llamaray.json imports into Grafana and charts only metrics we export, with their labels; and
the model replicas export what Ray Serve LLM's own dashboard and TTFT autoscaling policy query of vLLM."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("ray")

from deployments.metrics import METRICS  # noqa: E402

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "llamaray.json"
SERVE_TAGS = {"deployment", "replica", "application"}  # Serve adds them to every metric of ray.serve.metrics
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",), "gauge": ("",)}
METRIC_RE = re.compile(r"\bray_[a-z0-9_]+")


def exported(prometheus_name: str) -> tuple[str, tuple[str, ...]] | None:
    """(our metric, its tags) behind a series name as Ray's Prometheus endpoint shows it; None: not ours."""
    name = prometheus_name.removeprefix("ray_")
    for metric, (kind, _, _, tags) in METRICS.items():
        for suffix in SUFFIXES[kind]:
            # counters are exported with one `_total`, whether or not their name has it
            base = metric.removesuffix("_total") if kind == "counter" else metric
            if name == base + suffix:
                return metric, tags + (("le",) if suffix == "_bucket" else ())
    return None


def expressions(dashboard: dict) -> list[str]:
    out = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    out += [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return out


def check_expression(expr: str) -> None:
    """Every metric is one we export; every label it filters or groups on is one of theirs."""
    tags: set[str] = set(SERVE_TAGS)
    for name in METRIC_RE.findall(expr):
        found = exported(name)
        assert found is not None, f"{name} (in {expr!r}) is not exported by deployments/metrics.py"
        tags |= set(found[1])
    for name, selector in re.findall(r"(ray_[a-z0-9_]+)\{([^}]*)\}", expr):
        own = set(exported(name)[1]) | SERVE_TAGS
        for label in re.findall(r"([a-zA-Z_]+)\s*(?:=~|!~|!=|=)", selector):
            assert label in own, f"{name} has no label {label!r} (in {expr!r})"
    for group in re.findall(r"\bby\s*\(([^)]*)\)", expr):
        for label in (g.strip() for g in group.split(",")):
            assert label in tags, f"no metric of {expr!r} has the label {label!r}"
    for metric_name, label in re.findall(r"label_values\((ray_[a-z0-9_]+),\s*(\w+)\)", expr):
        assert label in set(exported(metric_name)[1]), expr


def test_dashboard_is_a_grafana_dashboard_over_our_metrics():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"] and isinstance(dashboard["schemaVersion"], int)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    charts = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(charts) >= 10
    for panel in charts:
        assert panel["datasource"]["uid"] == "${datasource}" and set(panel["gridPos"]) == {"h", "w", "x", "y"}
        assert panel["targets"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
    for expr in expressions(dashboard):
        check_expression(expr)
        for var in re.findall(r"\$(\w+)", expr):
            assert var in variables or var.startswith("__"), f"${var} is not a dashboard variable"
    # the series an operator needs at least: latency, queueing, throughput, cache hits, request outcomes
    text = json.dumps(dashboard)
    for metric in ("ray_vllm_time_to_first_token_seconds_bucket", "ray_vllm_request_time_per_output_token_seconds",
                   "ray_vllm_e2e_request_latency_seconds", "ray_vllm_request_queue_time_seconds",
                   "ray_vllm_generation_tokens_total", "ray_vllm_num_requests_waiting", "ray_vllm_prefix_cache_hits_total",
                   "ray_llamaray_requests_total"):
        assert metric in text, metric
    assert "by (protocol, status)" in text


def test_the_checks_catch_a_wrong_metric_or_label():
    with pytest.raises(AssertionError):
        check_expression("rate(ray_vllm_time_to_first_token_seconds_total[1m])")  # a histogram has no _total
    with pytest.raises(AssertionError):
        check_expression('ray_vllm_num_requests_running{model="m"}')  # vLLM's label is model_name
    with pytest.raises(AssertionError):
        check_expression("sum by (protocol) (rate(ray_vllm_generation_tokens_total[1m]))")


# What Ray Serve LLM queries of vLLM and we do not export: KV blocks in use (llama.cpp's KV is per slot, with
# no block pool to report) and swapped requests (vLLM v0 only, always empty on v1).
NOT_EXPORTED = {"ray_vllm_kv_cache_usage_perc", "ray_vllm_num_requests_swapped"}


def test_ray_serve_llm_dashboard_finds_our_vllm_metrics():
    panels = pytest.importorskip("ray.dashboard.modules.metrics.dashboards.serve_llm_dashboard_panels")
    rows = {row.title: row for row in panels.serve_llm_dashboard_config.rows}
    wanted = ("Throughput", "Latency", "Cache", "Request Length", "Scheduler")
    names = {name for title in wanted for panel in rows[title].panels for target in panel.targets
             for name in METRIC_RE.findall(target.expr) if name.startswith("ray_vllm_")}
    assert len(names) >= 15
    missing = sorted(n for n in names - NOT_EXPORTED if exported(n) is None)
    assert not missing, missing
    for name in names - NOT_EXPORTED:
        assert "model_name" in exported(name)[1], name  # the dashboard filters every vLLM series on it


def test_ttft_autoscaling_policy_query_reads_our_histogram():
    # Ray Serve LLM's TTFTAutoscalingPolicy (ray.serve.llm, after 2.60): p99 TTFT of one model.
    query = ('histogram_quantile(0.99, sum(rate(ray_vllm_time_to_first_token_seconds_bucket{model_name="m"}[1m])) '
             'by (le))')
    check_expression(query)
    # and its SLO policy's load and cache signals
    check_expression('sum(ray_vllm_num_requests_running{model_name="m"}) + sum(ray_vllm_num_requests_waiting{model_name="m"})')
    check_expression('sum(rate(ray_vllm_prefix_cache_hits_total{model_name="m"}[1m])) / '
                     'sum(rate(ray_vllm_prefix_cache_queries_total{model_name="m"}[1m]))')
