"""The models the Ingress lists and names: a card per configured model and per LoRA adapter of it (`<id>:<adapter>`),
in OpenAI's `model` shape with vLLM's and our extras (kind, context length, pool, parent), and whether a key may
see and use it (tenants/access.py)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..tenants.access import may_use
from ..tenants.policies import KeyPolicy


@dataclass(frozen=True)
class ModelCard:
    id: str
    owned_by: str = "llamaray"
    created: int = 0
    parent: str | None = None  # a LoRA adapter's card (`<base>:<adapter>`): its base model's id
    pool: str = ""  # the pool that loads it on demand (none: a deployment of its own)
    kind: str | None = None  # chat, embedding or rerank: which routes take it
    max_model_len: int | None = None  # its context, in tokens (vLLM's name for it)

    def allowed(self, policy: KeyPolicy | None) -> bool:
        """Whether the key's policy lets it use (and see) this model: tenants/access.py's one check."""
        if self.parent is None:
            return may_use(policy, self.id)
        return may_use(policy, self.parent, ((self.id[len(self.parent) + 1:], 1.0),))

    def to_dict(self) -> dict[str, Any]:
        card = {"id": self.id, "object": "model", "created": self.created, "owned_by": self.owned_by}
        if self.kind is not None:
            card["kind"] = self.kind
        if self.max_model_len is not None:
            card["max_model_len"] = self.max_model_len
        if self.parent is not None:  # as vLLM lists its LoRA modules
            card.update(parent=self.parent, root=self.parent)
        if self.pool:
            card["pool"] = self.pool
        return card


PoolStates = Callable[[], Awaitable[dict[str, str]]]
"""Each pooled model's state (loaded, loading, available), for /v1/models."""

def model_cards(specs: list[Any]) -> list[ModelCard]:
    """A card per model, each followed by one per LoRA adapter of it (`<id>:<adapter>`, its parent the model)."""
    created = int(time.time())
    cards = []
    for s in specs:
        about = {"kind": getattr(s, "kind", None), "max_model_len": getattr(s, "n_ctx", None)}
        cards.append(ModelCard(id=s.id, owned_by=s.owned_by, created=created, pool=getattr(s, "pool", ""), **about))
        cards += [ModelCard(id=f"{s.id}:{a.name}", owned_by=s.owned_by, created=created, parent=s.id, **about)
                  for a in getattr(s, "adapters", ())]
    return cards
