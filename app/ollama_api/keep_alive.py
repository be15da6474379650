"""What `keep_alive` does, through the pools' admin jobs (app/pools/admin.py) and the key's policy
(tenants/access.py, in PoolAdmin):

- a model with a deployment of its own is always loaded: `keep_alive` is accepted and changes nothing;
- a pooled model, a request that only loads (/api/generate without a prompt, /api/chat without messages, /api/embed
  without input): loaded now, as its first request would load it (any key that may use it);
- `keep_alive` negative (keep loaded): the pooled model is pinned (loaded first where it is not), so LRU eviction
  and `idle_unload_s` leave it, until an unpin (/admin/models/pin) or a `keep_alive: 0`;
- `keep_alive: 0` (unload): the pooled model is unloaded from every replica once its requests end (after this
  request's reply, or at once for a request that only loads);
- a positive duration: no timer: how long an idle pooled model stays is its pool's `idle_unload_s` and LRU order.

Pinning and unloading change what every other caller of a shared pool gets (a pin holds a slot of the pool; an
unload cuts others' warm model), so only a key that may call the admin routes (`admin: true`, or anyone on a server
without keys) pins or unloads this way; another key's negative or zero `keep_alive` is accepted and acts as absent."""

from __future__ import annotations

import logging
from typing import Any

from ..api.errors import as_api_error
from ..config.spec import ModelSpec
from ..generation.caller import Caller
from ..pools.admin import LoadModelRequest, PinModelRequest, PoolAdmin, UnloadModelRequest
from .options import FOREVER

log = logging.getLogger("llamaray.ollama")


def manages_pools(caller: Caller) -> bool:
    """Whether the caller may pin and unload pooled models (the admin routes' own rule)."""
    return caller.policy is None or caller.policy.admin


class KeepAlive:
    def __init__(self, pools: PoolAdmin | None) -> None:
        self.pools = pools

    def _acts(self, spec: ModelSpec, caller: Caller) -> bool:
        return self.pools is not None and bool(spec.pool) and manages_pools(caller)

    async def load_only(self, spec: ModelSpec, seconds: float | None, caller: Caller) -> str:
        """A request that only loads its model: its `done_reason`, `load` or `unload`."""
        if self.pools is None or not spec.pool:
            return "load"  # a deployment of its own: always loaded
        if seconds == 0 and manages_pools(caller):
            await self.pools.unload(UnloadModelRequest(model=spec.id), caller)
            return "unload"
        if seconds == FOREVER and manages_pools(caller):
            await self.pools.pin(PinModelRequest(model=spec.id, pinned=True), caller)
        else:
            await self.pools.load(LoadModelRequest(model=spec.id), caller)
        return "load"

    async def before(self, spec: ModelSpec, seconds: float | None, caller: Caller) -> None:
        """Before a generation: a negative `keep_alive` pins its pooled model."""
        if seconds == FOREVER and self._acts(spec, caller):
            await self.pools.pin(PinModelRequest(model=spec.id, pinned=True), caller)

    async def after(self, spec: ModelSpec, seconds: float | None, caller: Caller) -> None:
        """After a generation's reply: `keep_alive: 0` unloads its pooled model. The reply is answered already, so
        a model still busy with others' requests (409) stays loaded, said in the log."""
        if seconds != 0 or not self._acts(spec, caller):
            return
        try:
            await self.pools.unload(UnloadModelRequest(model=spec.id), caller)
        except Exception as exc:  # noqa: BLE001 - the client has its answer; the pool keeps the model
            api: Any = as_api_error(exc)
            log.info("keep_alive 0: model %r stays loaded: %s", spec.id, api.message if api else repr(exc))
