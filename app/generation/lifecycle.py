"""One generating request's lifecycle, the same for every protocol: planned off the event loop (in a `plan`
span, within limits.grammar_timeout_s), its model events read into the protocol's reply, whole or streamed,
and recorded once with how it ended (answered, refused, timed out, cut off by the client). A planning error
is the client's and comes before any of it: no model is asked and nothing is recorded. Each protocol's
service says only what differs: how it plans, which streams it opens, how events shape its reply."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from ..api.errors import invalid_request, timeout_error
from ..api.schemas import ChatCompletionRequest, CompletionRequest
from ..config.settings import Limits, ModelSpec
from ..engine.events import Event
from ..engine.params import GenerationRequest
from ..observe.request_records import NullObserver, RequestObserver, RequestRecord
from ..observe.tracing import traced
from .adapters import Target, served_target
from .caller import ANONYMOUS, Caller, cache_scope

T = TypeVar("T")
RequestT = TypeVar("RequestT", ChatCompletionRequest, CompletionRequest)
PlanT = TypeVar("PlanT")


async def off_loop(limits: Limits, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` (prompt rendering, grammar building: CPU work) in a thread, within
    limits.grammar_timeout_s: past it, a 400 `request_too_complex`."""
    budget = limits.grammar_timeout_s
    try:
        return await asyncio.wait_for(asyncio.to_thread(fn, *args), budget)
    except asyncio.TimeoutError:
        raise invalid_request(f"Preparing this request (chat template, grammar) took longer than {budget:g} s "
                              f"(limits.grammar_timeout_s); simplify its tools, schema or grammar.",
                              code="request_too_complex") from None


class Reply(Protocol):
    """One request's reply in its protocol's shape, built from the batches its service's `events` yield
    (each protocol's own shape of batch)."""

    def read(self, batch: Any) -> None:
        """A batch of a whole (unstreamed) reply."""

    def check(self) -> None:
        """After a whole reply's last batch: raise to refuse it as a whole."""

    def body(self) -> dict[str, Any]:
        """The whole reply's body."""

    def chunks(self, batch: Any) -> list[dict[str, Any]]:
        """A batch of a streamed reply: the chunks it makes (raise to end the stream with an error)."""

    def usage_chunk(self) -> dict[str, Any]:
        """A stream's last chunk when the client asked for usage."""

    def record(self, protocol: str, stream: bool, failure: BaseException | None) -> RequestRecord:
        """What the observer is told about the request, which ended with `failure` (None: answered)."""


@contextmanager
def recording(observer: RequestObserver, record: Callable[[BaseException | None], RequestRecord]) -> Iterator[None]:
    """The block's outcome handed to `record`, its record to `observer`: once, however the block ends (an
    error, a cancellation, a stream closed by its reader); the block's exception goes on as it was."""
    failure: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        failure = exc
        raise
    finally:
        observer.record(record(failure))


async def pooled_request(observer: RequestObserver, protocol: str, model: str, limits: Limits,
                         call: Callable[[], Awaitable[T]]) -> T:
    """A request answered by one pooled pass of its model (embeddings, rerank): `call` within
    limits.request_timeout_s, recorded once with its input tokens (`prompt_tokens` of its result)."""
    done: list[Any] = []
    started = time.monotonic()

    def record(failure: BaseException | None) -> RequestRecord:
        status, code = "ok", None
        if isinstance(failure, asyncio.CancelledError):
            status = "cancelled"
        elif failure is not None:
            code = getattr(failure, "code", None) or "internal_error"
            status = "timeout" if code == "timeout" else "error"
        return RequestRecord(model=model, stream=False, status=status, error_code=code,
                             duration_s=time.monotonic() - started, ttft_s=None, itl_s=None,
                             prompt_tokens=done[0].prompt_tokens if done else 0, completion_tokens=0,
                             cached_tokens=0, protocol=protocol)

    with recording(observer, record):
        try:
            async with asyncio.timeout(limits.request_timeout_s):
                done.append(await call())
        except TimeoutError:
            raise timeout_error(limits.request_timeout_s) from None
    return done[0]


ReplyT = TypeVar("ReplyT", bound=Reply)


class RequestLifecycle(Generic[RequestT, PlanT, ReplyT]):
    """A protocol's service: `complete` and `stream` over the lifecycle. Subclasses set `protocol` and give
    `make_plan`, `plan_attributes`, `reply` and `events`."""

    protocol: ClassVar[str]

    def __init__(self, specs: list[ModelSpec],
                 open_stream: Callable[[str, GenerationRequest], AsyncIterator[list[Event]]], *,
                 limits: Limits | None = None, observer: RequestObserver | None = None,
                 per_key_cache: bool = True) -> None:
        self.models = {s.id: s for s in specs}
        self.open_stream = open_stream
        self.limits = limits or Limits()
        self.observer = observer or NullObserver()
        self.per_key_cache = per_key_cache

    def make_plan(self, req: RequestT, spec: ModelSpec, scope: str) -> PlanT:
        """The request's plan for `spec`, its prompts to share cached prefixes within `scope`. Runs in a
        thread: pure CPU work, no event loop."""
        raise NotImplementedError

    def plan_attributes(self, plan: PlanT) -> dict[str, Any]:
        """What planning decided, for its span."""
        raise NotImplementedError

    def use_adapters(self, plan: PlanT, adapters: tuple[tuple[str, float], ...]) -> None:
        """Set the LoRA adapters (name, scale) the plan's generations decode under."""
        raise NotImplementedError

    def target(self, req: RequestT) -> Target:
        """The request's base model and adapters (`model`, `lora`): a 404 for a model or adapter not configured."""
        return served_target(self.models, req.model, "chat",
                             "/v1/chat/completions" if self.protocol == "chat" else f"/v1/{self.protocol}",
                             getattr(req, "lora", None))

    def _record(self, target: Target, reply: ReplyT, stream: bool, failure: BaseException | None) -> RequestRecord:
        rec = reply.record(self.protocol, stream, failure)
        return replace(rec, adapter=target.label) if target.label else rec

    def reply(self, plan: PlanT, stream: bool) -> ReplyT:
        """A reply to fill from the plan's events, whole or streamed."""
        raise NotImplementedError

    def events(self, plan: PlanT, reply: ReplyT) -> AsyncIterator[Any]:
        """The plan's model events in batches, until the reply is done or its deadline passes."""
        raise NotImplementedError

    def is_whole(self, reply: ReplyT) -> bool:
        """Whether a streamed reply is whole: its final chunk made, not yet sent (then `whole` runs)."""
        return False

    async def whole(self, req: RequestT, reply: ReplyT, caller: Caller) -> None:
        """Once per answered request, when its reply is whole and before the client has its end (the body,
        or a stream's final chunk): what the protocol keeps of it. Nothing by default."""

    async def plan(self, req: RequestT, caller: Caller = ANONYMOUS) -> PlanT:
        """The request's plan, built off the event loop (template rendering and grammar building are CPU
        work) and within limits.grammar_timeout_s."""
        target = self.target(req)
        scope = cache_scope(caller, req.cache_salt, self.per_key_cache)
        plan = await traced("plan", off_loop(self.limits, self.make_plan, req, target.spec, scope),
                            self.plan_attributes)
        if target.adapters:
            self.use_adapters(plan, target.adapters)
        return plan

    async def complete(self, req: RequestT, caller: Caller = ANONYMOUS) -> dict[str, Any]:
        plan = await self.plan(req, caller)
        target = self.target(req)
        reply = self.reply(plan, False)
        with recording(self.observer, lambda failure: self._record(target, reply, False, failure)):
            async for batch in self.events(plan, reply):
                reply.read(batch)
            reply.check()
            body = reply.body()
            await self.whole(req, reply, caller)
        return body

    async def stream(self, req: RequestT, caller: Caller = ANONYMOUS) -> AsyncIterator[list[dict[str, Any]]]:
        """Chunk batches; the first is empty: "accepted", planning passed (its errors are the client's
        and come before it), so the Ingress can answer with headers while the model is awaited."""
        plan = await self.plan(req, caller)
        target = self.target(req)
        reply = self.reply(plan, True)
        kept = False
        with recording(self.observer, lambda failure: self._record(target, reply, True, failure)):
            yield []
            async for batch in self.events(plan, reply):
                out = reply.chunks(batch)
                if not kept and self.is_whole(reply):
                    await self.whole(req, reply, caller)
                    kept = True
                if out:
                    yield out
            if req.include_usage:
                yield [reply.usage_chunk()]
