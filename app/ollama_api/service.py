"""/api/chat and /api/generate as adapters of the generation core (app/generation/core.py), as the Messages API
is: a request is mapped onto the chat request it means (mapping.py), planned, generated and read by the core, and
what was read is shaped as Ollama's records (shaping.py). `raw: true` on /api/generate is a legacy completion (the
prompt as it is: the completions service's planning and events) shaped the same way, and so is one with a `suffix`
(fill in the middle: the completions service lays out the model's FIM tokens). A request that only loads its
model (no prompt, no messages) is answered by `keep_alive` (keep_alive.py) without generating."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from ..api.errors import APIError
from ..completions.service import CompletionPlan, CompletionService, plan_completion
from ..config.app_args import Limits
from ..config.spec import ModelSpec
from ..engine.events import Event
from ..generation.adapters import Target, reached_model, served_target
from ..generation.caller import ANONYMOUS, Caller, cache_scope
from ..generation.core import GenerationCore
from ..generation.lifecycle import Lifecycle, plan_off_loop
from ..generation.plan import GenerationPlan, grammar_limits
from ..generation.rounds import Generate
from ..grammar.request_grammars import json_grammar
from ..observe.request_records import RequestObserver
from ..pools.admin import PoolAdmin
from .errors import images_named, num_predict_named
from .keep_alive import KeepAlive
from .mapping import response_format, to_chat_request, to_completion_request
from .names import resolved
from .options import check_num_ctx, keep_alive_seconds, penalty_window, read_options
from .replies import OllamaPlan, RawReply, TurnReply
from .schemas import OllamaChatRequest, OllamaGenerateRequest, _Generating
from .shaping import load_record

PROTOCOL = "ollama"


class _Turns:
    """The lifecycle's `Generating` for a templated turn: mapped to a chat request and planned by the core."""

    protocol = PROTOCOL

    def __init__(self, core: GenerationCore) -> None:
        self.core = core

    def target(self, req: _Generating, caller: Caller) -> Target:
        return self.core.target(req.model, _route(req), caller)

    def make_plan(self, req: _Generating, spec: ModelSpec, scope: str) -> GenerationPlan:
        """The request mapped and planned for `spec` (in a thread: pure CPU work)."""
        sampling = read_options(req.options)
        check_num_ctx(sampling, spec)
        mapped = to_chat_request(req, sampling)  # type: ignore[arg-type]
        try:
            plan = self.core.plan_chat(mapped.chat, spec, scope)
        except APIError as exc:
            raise num_predict_named(exc) from None
        window = penalty_window(sampling, spec)
        if window is not None:
            plan.gen.sampling.penalty_last_n = window
        return plan

    async def plan(self, req: _Generating, caller: Caller = ANONYMOUS) -> OllamaPlan[GenerationPlan]:
        received = time.monotonic()
        try:
            inner = await self.core.plan(req, self.target(req, caller), self.core.scope(caller, None), self.make_plan,
                                         caller)
        except APIError as exc:
            raise images_named(exc, req) from None
        return OllamaPlan(inner, req, received)

    def reply(self, plan: OllamaPlan[GenerationPlan], stream: bool) -> TurnReply:
        return TurnReply(plan)

    def events(self, plan: OllamaPlan[GenerationPlan], reply: TurnReply) -> AsyncIterator[tuple[int, list[Event]]]:
        return self.core.events(plan.inner, reply.reader)

    async def keep(self, req: Any, reply: Any, caller: Caller) -> None:
        """An Ollama turn keeps nothing."""


class _RawGenerations:
    """The lifecycle's `Generating` for `raw: true` and `suffix`: the completions service's planning (no template;
    a `suffix` in the model's fill-in-the-middle layout) and events."""

    protocol = PROTOCOL

    def __init__(self, completions: CompletionService, limits: Limits, per_key_cache: bool) -> None:
        self.completions = completions
        self.limits = limits
        self.per_key_cache = per_key_cache

    def target(self, req: OllamaGenerateRequest, caller: Caller) -> Target:
        return served_target(self.completions.models, req.model, "chat", "/api/generate", policy=caller.policy)

    def make_plan(self, req: OllamaGenerateRequest, spec: ModelSpec, scope: str) -> CompletionPlan:
        sampling = read_options(req.options)
        check_num_ctx(sampling, spec)
        try:
            plan = plan_completion(to_completion_request(req, sampling), spec, self.limits, scope)
        except APIError as exc:
            raise num_predict_named(exc) from None
        gen = plan.gens[0]
        fmt = response_format(req.format)
        if fmt is not None:
            schema = {"type": "object"} if fmt["type"] == "json_object" else fmt["json_schema"]["schema"]
            gen.sampling.grammar = json_grammar(schema, "format", grammar_limits(self.limits))
        window = penalty_window(sampling, spec)
        if window is not None:
            gen.sampling.penalty_last_n = window
        return plan

    async def plan(self, req: OllamaGenerateRequest, caller: Caller = ANONYMOUS) -> OllamaPlan[CompletionPlan]:
        received = time.monotonic()
        target = self.target(req, caller)
        scope = cache_scope(caller, None, self.per_key_cache)
        inner = await plan_off_loop(self.limits, caller, self.make_plan, req, target.spec, scope,
                                    lambda plan: {"llamaray.prompts": 1})
        for gen in inner.gens:
            gen.adapters = target.adapters or gen.adapters
            gen.tenant, gen.weight = caller.tenant, caller.weight
        return OllamaPlan(inner, req, received)

    def reply(self, plan: OllamaPlan[CompletionPlan], stream: bool) -> RawReply:
        return RawReply(plan)

    def events(self, plan: OllamaPlan[CompletionPlan], reply: RawReply) -> AsyncIterator[Any]:
        return self.completions.events(plan.inner, reply)  # it counts into reply.tally

    async def keep(self, req: Any, reply: Any, caller: Caller) -> None:
        """A generation keeps nothing."""


def _route(req: Any) -> str:
    return "/api/chat" if isinstance(req, OllamaChatRequest) else "/api/generate"


class OllamaService:
    """/api/chat and /api/generate, recorded under the protocol `ollama`."""

    protocol = PROTOCOL

    def __init__(self, specs: list[ModelSpec], generate: Generate, *, limits: Limits | None = None,
                 observer: RequestObserver | None = None, per_key_cache: bool = True,
                 pools: PoolAdmin | None = None) -> None:
        limits = limits or Limits()
        self.models = {s.id: s for s in specs}
        self.keep_alive = KeepAlive(pools)
        core = GenerationCore(specs, generate, limits=limits, per_key_cache=per_key_cache)
        completions = CompletionService(specs, generate, limits=limits, per_key_cache=per_key_cache)
        self.turns = Lifecycle(_Turns(core), observer)
        self.raw = Lifecycle(_RawGenerations(completions, limits, per_key_cache), observer)

    def _lifecycle(self, req: _Generating) -> Lifecycle[Any, Any, Any]:
        return self.raw if isinstance(req, OllamaGenerateRequest) and req.completes else self.turns

    def _loads_only(self, req: _Generating) -> bool:
        return not req.messages if isinstance(req, OllamaChatRequest) else req.loads_only  # type: ignore[attr-defined]

    async def _load(self, req: _Generating, seconds: float | None, caller: Caller) -> dict[str, Any]:
        read_options(req.options)  # its errors, as for a generation
        spec, _ = reached_model(self.models, req.model, caller.policy)
        reason = await self.keep_alive.load_only(spec, seconds, caller)
        return load_record(req.name, isinstance(req, OllamaChatRequest), reason)

    def _prepared(self, req: _Generating, caller: Caller) -> tuple[_Generating, float | None]:
        req = resolved(self.models, req, caller)
        return req, keep_alive_seconds(req.keep_alive)

    def _generating(self, req: _Generating, caller: Caller) -> ModelSpec:
        """The model a generation runs on, once what can be told before planning is: a model of the route's kind,
        valid options (a pin for a request refused at once would outlive it)."""
        read_options(req.options)
        return self._lifecycle(req).service.target(req, caller).spec

    async def complete(self, req: _Generating, caller: Caller = ANONYMOUS) -> dict[str, Any]:
        req, seconds = self._prepared(req, caller)
        if self._loads_only(req):
            return await self._load(req, seconds, caller)
        spec = self._generating(req, caller)
        await self.keep_alive.before(spec, seconds, caller)
        body = await self._lifecycle(req).complete(req, caller)
        await self.keep_alive.after(spec, seconds, caller)
        return body

    async def stream(self, req: _Generating, caller: Caller = ANONYMOUS) -> AsyncIterator[list[dict[str, Any]]]:
        req, seconds = self._prepared(req, caller)
        if self._loads_only(req):
            record = await self._load(req, seconds, caller)
            yield []
            yield [record]
            return
        spec = self._generating(req, caller)
        await self.keep_alive.before(spec, seconds, caller)
        events = self._lifecycle(req).stream(req, caller)
        try:
            async for batch in events:
                yield batch
        finally:
            await events.aclose()
        await self.keep_alive.after(spec, seconds, caller)

