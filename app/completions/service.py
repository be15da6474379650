"""CompletionService: legacy text completions, over the request lifecycle every generating protocol shares
(app/generation/lifecycle.py) and the core's deadline, stream merging and tally; not over the core's chat
planning and reading (no template, no parsers: the text is the reply). Each prompt of the request is one generation of `n` choices (choice
index = prompt × n + i, as OpenAI numbers them); the prompts run together, under one deadline, and
their events are shaped into `text_completion`s."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ..prompt import content_marks
from ..generation.adapters import Target, served_target
from ..generation.caller import ANONYMOUS, Caller, cache_scope
from ..generation.choices import merge
from ..generation.plan import check_completion_limit, client_gbnf, completion_limit, sampling_from
from ..generation.rounds import Generate, with_deadline
from ..generation.tally import ReplyTally
from ..config.app_args import Limits
from ..config.spec import ModelSpec
from ..engine.events import Event, Finished, PromptLogprobs, Started, Text
from ..engine.admission import WAITING_PER_SLOT
from ..engine.params import GenerationRequest, InfillPrompt
from ..api.errors import APIError, invalid_request
from ..api.schemas import CompletionRequest
from ..observe.request_records import RequestObserver, RequestRecord
from ..generation.lifecycle import Lifecycle, plan_off_loop
from .responses import CompletionMaker, LegacyLogprobs, choice

T = TypeVar("T")


@dataclass(frozen=True)
class CompletionPlan:
    req: CompletionRequest
    spec: ModelSpec
    request_id: str
    gens: list[GenerationRequest]  # one per prompt, each for `n` choices
    n: int


def plan_completion(req: CompletionRequest, spec: ModelSpec, limits: Limits, scope: str = "") -> CompletionPlan:
    """The request's generations: its prompts as they are (no template; the client writes the whole
    input, so control-token text in it is parsed as llama-server and vLLM do), shared sampling; with a `suffix`,
    each prompt and the suffix around the completion (fill in the middle)."""
    check_completion_limit(req.max_tokens, "max_tokens", spec)
    if len(req.prompts) > WAITING_PER_SLOT * spec.n_seq_max:
        # More generations than the model's queue holds: however idle the server, they could not all wait.
        raise invalid_request(f"`prompt` has {len(req.prompts)} prompts; model `{spec.id}` takes at most "
                              f"{WAITING_PER_SLOT * spec.n_seq_max} in one request ({WAITING_PER_SLOT} per slot, "
                              f"{spec.n_seq_max} slots). Send them in several requests.", param="prompt",
                              code="too_many_prompts")
    grammar = client_gbnf(req.grammar, limits)
    sampling = sampling_from(req, spec.n_vocab)
    sampling.grammar = grammar
    request_id, n = uuid.uuid4().hex, req.n or 1
    score_prompt = bool(req.echo) and req.logprobs is not None
    share = limits.max_logprob_entries // max(1, len(req.prompts))  # each prompt's part of the request's logprobs
    # With a `suffix`, each prompt is the text before an insertion: a fill-in-the-middle prompt the model's
    # replica lays out from its FIM tokens, as /infill's (app/engine/infill.py), neither read for control tokens.
    gens = [GenerationRequest(request_id=f"{request_id}-{p}", prompt="" if req.suffix else content_marks.clean(prompt),
                              infill=InfillPrompt(prefix=prompt, suffix=req.suffix) if req.suffix else None,
                              max_tokens=completion_limit(req.max_tokens, spec), stop=req.stop_list, sampling=replace(sampling), n=n,
                              logprobs=req.logprobs, prompt_logprobs=score_prompt, cache_scope=scope,
                              cache_prompt=req.cache_prompt is not False, max_logprob_entries=share,
                              speculative=req.speculative is not False, spec_n_max=req.speculative_n_max,
                              spec_n_min=req.speculative_n_min)
            for p, prompt in enumerate(req.prompts)]
    return CompletionPlan(req, spec, request_id, gens, n)


class Choice:
    """One choice's text, legacy logprobs and finish reason, as its events arrive. Each event gives
    the part a stream sends for it: (text, with logprobs, finish reason), or None."""

    def __init__(self, index: int, prompt: str, echo: bool, logprobs: bool) -> None:
        self.index = index
        self.prompt = prompt if echo else None  # still to echo
        self.pieces: list[str] = []
        self.logprobs = LegacyLogprobs() if logprobs else None
        self.scores_prompt = echo and logprobs
        self.finish_reason: str | None = None

    def started(self) -> str | None:
        return None if self.scores_prompt else self._echo()

    def prompt_scored(self, ev: PromptLogprobs) -> str | None:
        if self.prompt is None or self.logprobs is None:
            return None  # echoed already (the prompt's scores came once per choice)
        self.logprobs.add(ev.entries)
        return self._echo()

    def _echo(self) -> str | None:
        text, self.prompt = self.prompt, None
        if text is not None:
            self.pieces.append(text)
        return text

    def text(self, ev: Text) -> str:
        if self.logprobs is not None:
            self.logprobs.add(ev.logprobs)
        self.pieces.append(ev.text)
        return ev.text

    def finished(self, ev: Finished) -> None:
        self.finish_reason = ev.finish_reason

    def body(self) -> dict[str, Any]:
        return choice(self.index, "".join(self.pieces), self.logprobs.take() if self.logprobs else None,
                      self.finish_reason)


async def _prompt_errors(events: AsyncIterator[T]) -> AsyncIterator[T]:
    """The engine's context-length error names the chat route's `messages`; here it is the `prompt`."""
    try:
        async for item in events:
            yield item
    except APIError as exc:
        if exc.code != "context_length_exceeded" or exc.param != "messages":
            raise
        raise APIError(exc.message.replace("messages", "prompt"), param="prompt", code=exc.code,
                       status=exc.status, type=exc.type, headers=exc.headers) from None
    finally:
        await events.aclose()


class CompletionReply:
    """A legacy reply: its choices (index = prompt × n + i) and one tally for all of them; for a stream, the
    chunks they make. Batches: [(prompt number, event)]."""

    def __init__(self, plan: CompletionPlan, stream: bool) -> None:
        self.plan = plan
        req = plan.req
        self.choices = [Choice(p * plan.n + i, prompt, bool(req.echo), req.logprobs is not None)
                        for p, prompt in enumerate(req.prompts) for i in range(plan.n)]
        self.tally = ReplyTally()
        self.maker = CompletionMaker(plan.request_id, req.model) if stream else None

    def read(self, batch: list[tuple[int, Event]]) -> None:
        for p, ev in batch:
            self._apply(p, ev)

    def check(self) -> None:
        """A legacy completion is answered as it came out, however empty."""

    def body(self) -> dict[str, Any]:
        maker = CompletionMaker(self.plan.request_id, self.plan.req.model)
        return maker.body([c.body() for c in self.choices], self.tally.usage())

    def chunks(self, batch: list[tuple[int, Event]]) -> list[dict[str, Any]]:
        return [chunk for p, ev in batch for chunk in self._apply(p, ev, self.maker)]

    @property
    def whole(self) -> bool:
        return all(c.finish_reason is not None for c in self.choices)

    def tail(self) -> list[dict[str, Any]]:
        """The usage chunk, when the client asked for it (`stream_options.include_usage`)."""
        return [self.maker.usage(self.tally.usage())] if self.plan.req.include_usage else []

    def record(self, protocol: str, stream: bool, failure: BaseException | None) -> RequestRecord:
        return self.tally.record(self.plan.spec.id, stream, failure, protocol)

    def _apply(self, p: int, ev: Event, maker: CompletionMaker | None = None) -> list[dict[str, Any]]:
        """`ev` into its choice (or, the prompt's scores, into each of the prompt's choices that has
        not echoed yet); with `maker`, the chunks it makes."""
        n, choices = self.plan.n, self.choices
        base = p * n
        if isinstance(ev, PromptLogprobs):
            targets = [choices[base + i] for i in range(n)]
            parts = [(c, c.prompt_scored(ev), None) for c in targets]
        else:
            c = choices[base + ev.index]
            if isinstance(ev, Started):
                parts = [(c, c.started(), None)]
            elif isinstance(ev, Text):
                parts = [(c, c.text(ev), None)]
            elif isinstance(ev, Finished):
                c.finished(ev)
                parts = [(c, "", ev.finish_reason)]
            else:
                parts = []
        if maker is None:
            return []
        return [maker.chunk(c.index, text, c.logprobs.take() if c.logprobs else None, finish)
                for c, text, finish in parts if text is not None and (text or finish or c.logprobs)]


class CompletionService:
    """`/v1/completions`: each prompt generated as it is, shaped as `text_completion`s."""

    protocol = "completions"

    def __init__(self, specs: list[ModelSpec], generate: Generate, *, limits: Limits | None = None,
                 observer: RequestObserver | None = None, per_key_cache: bool = True) -> None:
        self.models = {s.id: s for s in specs}
        self.generate = generate
        self.limits = limits or Limits()
        self.per_key_cache = per_key_cache
        self.lifecycle: Lifecycle[CompletionRequest, CompletionPlan, CompletionReply] = Lifecycle(self, observer)

    def target(self, req: CompletionRequest, caller: Caller) -> Target:
        return served_target(self.models, req.model, "chat", "/v1/completions", req.lora, caller.policy)

    def make_plan(self, req: CompletionRequest, spec: ModelSpec, scope: str) -> CompletionPlan:
        """The request's plan for `spec` (in a thread: pure CPU work)."""
        return plan_completion(req, spec, self.limits, scope)

    async def plan(self, req: CompletionRequest, caller: Caller = ANONYMOUS) -> CompletionPlan:
        target = self.target(req, caller)
        scope = cache_scope(caller, req.cache_salt, self.per_key_cache)
        plan = await plan_off_loop(self.limits, caller, self.make_plan, req, target.spec, scope, plan_attributes)
        for gen in plan.gens:
            gen.adapters = target.adapters or gen.adapters
            gen.tenant, gen.weight, gen.batch = caller.tenant, caller.weight, caller.batch
        return plan

    def reply(self, plan: CompletionPlan, stream: bool) -> CompletionReply:
        return CompletionReply(plan, stream)

    async def keep(self, req: CompletionRequest, reply: CompletionReply, caller: Caller) -> None:
        """A completion keeps nothing."""

    async def complete(self, req: CompletionRequest, caller: Caller = ANONYMOUS) -> dict[str, Any]:
        return await self.lifecycle.complete(req, caller)

    def stream(self, req: CompletionRequest, caller: Caller = ANONYMOUS) -> AsyncIterator[list[dict[str, Any]]]:
        return self.lifecycle.stream(req, caller)

    async def events(self, plan: CompletionPlan, reply: CompletionReply) -> AsyncIterator[list[tuple[int, Event]]]:
        """Each batch's events with their prompt's number, recorded in the reply's tally, until every
        choice finished or the deadline passed (504)."""
        timeout_s, tally = self.limits.request_timeout_s, reply.tally
        deadline = time.monotonic() + timeout_s
        sources = [with_deadline(self.generate(plan.spec.id, gen), deadline, timeout_s) for gen in plan.gens]
        finished = [0] * len(sources)
        async for p, batch in _prompt_errors(merge(sources)):
            for ev in batch:
                if isinstance(ev, Started) and ev.index == 0:
                    tally.add_prompt(ev)
                elif isinstance(ev, Text):
                    tally.add_text(ev.text)
                elif isinstance(ev, Finished):
                    tally.end_round(ev)
                    finished[p] += 1
            yield [(p, ev) for ev in batch]
        if any(done < plan.n for done in finished):
            raise APIError("The model stream ended without finishing.", status=502, type="server_error",
                           code="incomplete_generation")


def plan_attributes(plan: CompletionPlan) -> dict[str, Any]:
    """What planning decided, for its span."""
    return {"llamaray.prompts": len(plan.gens), "gen_ai.request.choice.count": plan.n}
