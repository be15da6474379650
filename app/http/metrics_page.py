"""`GET /metrics` on the API's own port, where Prometheus users of vLLM and llama-server look: the node's metrics as
Ray's metrics agent exports them (the deployments say where: deployments/node_metrics.py), with only this
application's own series: `ray_llamaray_*` and the vLLM-named `ray_vllm_*`, tagged with this application's name.
Ray's own series (every process on the node) and other applications' (another team's vLLM on a shared node) are
Ray's port's business, not the API's.

Behind the API's key check, like every route but /health, and what a key reads is what it may see: an admin key
(or anyone on a server without keys, which the browser guard keeps web pages from) reads every series of the
application; any other key only the series of models it may use (tenants/access.py: by their `model`, `adapter`,
`model_name` labels and a model deployment's `deployment` tag) and, of the per-key series, its own key's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from ..config.spec import deployment_name
from ..observe.prometheus_text import Keep, select
from ..tenants.access import may_use
from ..tenants.policies import KeyPolicy
from .model_cards import ModelCard

OUR_FAMILIES = ("ray_llamaray_", "ray_vllm_")
TENANT_FAMILIES = "ray_llamaray_tenant_"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class NodeMetrics:
    """Where the Ingress reads its node's export (`read`: the exposition text), and the application whose series
    are this server's (Serve's `application` tag)."""

    read: Callable[[], Awaitable[str]]
    application: str


def ours(name: str) -> bool:
    return name.startswith(OUR_FAMILIES)


def visible_series(application: str, policy: KeyPolicy | None, cards: Mapping[str, ModelCard]) -> Keep:
    """Which samples of this application the key with `policy` reads (module docstring)."""
    unrestricted = policy is None or policy.admin
    own_deployments = {deployment_name(c.id): c for c in cards.values() if c.parent is None and not c.pool}

    def model_allowed(model: str, adapters: str = "") -> bool:
        card = cards.get(model)
        if card is None:
            return False
        if adapters and card.parent is None:
            return may_use(policy, card.id, tuple((a, 1.0) for a in adapters.split(",") if a))
        return card.allowed(policy)

    def keep(name: str, labels: dict[str, str]) -> bool:
        if labels.get("application") != application:
            return False
        if unrestricted:
            return True
        if name.startswith(TENANT_FAMILIES) and "key" in labels and labels["key"] != policy.name:  # type: ignore[union-attr]
            return False
        if "model" in labels and not model_allowed(labels["model"], labels.get("adapter", "")):
            return False
        if "model_name" in labels and not model_allowed(labels["model_name"]):
            return False
        deployment = own_deployments.get(labels.get("deployment", ""))
        return deployment is None or deployment.allowed(policy)

    return keep


def metrics_text(export: str, application: str, policy: KeyPolicy | None, cards: Mapping[str, ModelCard]) -> str:
    return select(export, ours, visible_series(application, policy, cards))
