"""The generation core every chat-shaped protocol composes (chat completions, Responses, Messages): it plans a
turn from a chat request (template, tools, grammar, limits, per-key cache scope, adapters, images), runs the
turn's choices and rounds through the models, and reads the reply (`ReplyReader`: neutral events and
results). A protocol gives what it asks (its request as a chat request, planned by `plan_chat`) and shapes
what comes back; it never sees a chat completion."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from ..api.schemas import ChatCompletionRequest
from ..config.app_args import Limits
from ..config.spec import ModelSpec
from ..engine.events import Event
from ..prompt.tool_calling import resolve_reply_format
from .adapters import Target, served_target
from .caller import ANONYMOUS, Caller, cache_scope
from .choices import ChoiceSplitter, merge
from .images import load_images
from .lifecycle import plan_off_loop
from .plan import GenerationPlan, plan_request
from .reading import ReplyReader
from .rounds import Generate, reply_events

RequestT = TypeVar("RequestT")


class GenerationCore:
    """`generate`: how a generation reaches a model (the models' stream in production, an engine or a fake
    in tests)."""

    def __init__(self, specs: list[ModelSpec], generate: Generate, *, limits: Limits | None = None,
                 per_key_cache: bool = True) -> None:
        self.models = {s.id: s for s in specs}
        self.generate = generate
        self.limits = limits or Limits()
        self.per_key_cache = per_key_cache
        self.formats = {s.id: resolve_reply_format(s.chat_template, s.reasoning_parser, s.tool_parser)
                        for s in specs}

    def target(self, model: str, route: str, caller: Caller, lora: Any = None) -> Target:
        """The base chat model and adapters `model` (and `lora`) name: a 404 that names `route` for one not
        configured or not the caller's key's to use."""
        return served_target(self.models, model, "chat", route, lora, caller.policy)

    def scope(self, caller: Caller, cache_salt: str | None) -> str:
        """Where the turn's prompt may share cached prefixes: the caller's key (when per-key) and salt."""
        return cache_scope(caller, cache_salt, self.per_key_cache)

    def plan_chat(self, req: ChatCompletionRequest, spec: ModelSpec, scope: str) -> GenerationPlan:
        """A chat request's plan for `spec` (pure CPU work: run off the loop)."""
        plan = plan_request(req, spec, self.formats[spec.id], self.limits)
        plan.gen.cache_scope = scope
        plan.gen.cache_prompt = req.cache_prompt is not False
        plan.gen.speculative = req.speculative is not False
        plan.gen.spec_n_max, plan.gen.spec_n_min = req.speculative_n_max, req.speculative_n_min
        return plan

    async def plan(self, req: RequestT, target: Target, scope: str,
                   make_plan: Callable[[RequestT, ModelSpec, str], GenerationPlan],
                   caller: Caller = ANONYMOUS) -> GenerationPlan:
        """`make_plan(req, spec, scope)` (a protocol's request mapped and planned by `plan_chat`) off the event
        loop, within limits.grammar_timeout_s; then the target's adapters set and the images loaded (planning
        checked them): decoded here, so the model's replica receives pixels and never fetches anything."""
        plan = await plan_off_loop(self.limits, caller, make_plan, req, target.spec, scope, plan_attributes)
        if target.adapters:
            plan.gen.adapters = target.adapters  # a continuation round copies plan.gen, adapters included
        plan.gen.images = await load_images(plan.req, self.limits, caller.tenant)
        plan.gen.tenant, plan.gen.weight, plan.gen.batch = caller.tenant, caller.weight, caller.batch
        return plan

    def reader(self, plan: GenerationPlan) -> ReplyReader:
        return ReplyReader(plan)

    def events(self, plan: GenerationPlan, reader: ReplyReader) -> AsyncIterator[tuple[int, list[Event]]]:
        """(choice index, its events) as the model makes them, each choice read in its own rounds, until the
        reply is done or limits.request_timeout_s passes (504)."""
        timeout_s, choices = self.limits.request_timeout_s, reader.choices
        if len(choices) == 1:
            return merge([reply_events(self.generate, plan, choices[0].parser, choices[0].tally, timeout_s)])
        split = ChoiceSplitter(self.generate(plan.spec.id, plan.gen), len(choices))
        return merge([reply_events(self.generate, plan, c.parser, c.tally, timeout_s, first=split.choice(i))
                      for i, c in enumerate(choices)])


def plan_attributes(plan: GenerationPlan) -> dict[str, Any]:
    """What planning decided, for its span."""
    return {"llamaray.prompt_chars": len(plan.gen.prompt), "llamaray.grammar": plan.gen.sampling.grammar is not None,
            "llamaray.tools": len(plan.req.tools or []), "gen_ai.request.choice.count": plan.gen.n}
