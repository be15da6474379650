"""One generating request's lifecycle, the same for every protocol: planned off the event loop (in a `plan`
span, within limits.grammar_timeout_s), its model events read into the protocol's reply, whole or streamed,
and recorded once with how it ended (answered, refused, timed out, cut off by the client). A planning error
is the client's and comes before any of it: no model is asked and nothing is recorded. Each protocol's
service says only what differs (`Generating`): how it plans, which streams it opens, how events shape its
reply (`Reply`), what it keeps of an answered request."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, Protocol, TypeVar

from ..api.errors import invalid_request, overloaded, timeout_error
from ..config.app_args import Limits
from ..config.spec import ModelSpec
from ..observe.request_records import NullObserver, RequestObserver, RequestRecord
from ..observe.tracing import traced
from ..tenants.prep_pool import PREPARATION
from .adapters import Target
from .caller import ANONYMOUS, Caller

T = TypeVar("T")


async def off_loop(limits: Limits, caller: Caller, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` (prompt rendering, grammar building: CPU work) on the preparation pool in the caller's key's
    turn (app/tenants/prep_pool.py), within limits.grammar_timeout_s, waiting for a thread included: past it, a
    400 `request_too_complex` (a job not started by then never runs). A batch line's job waits behind interactive
    ones: one that never got a thread is a retryable 503, not the line's fault."""
    budget = limits.grammar_timeout_s
    job = PREPARATION.submit(caller.tenant, fn, *args, low=caller.batch)
    try:
        return await asyncio.wait_for(job.future, budget)
    except asyncio.TimeoutError:
        if not PREPARATION.cancel(job) and caller.batch:
            raise overloaded("Interactive requests kept the preparation threads busy; this batch line is sent "
                             "again later.") from None
        raise invalid_request(f"Preparing this request (chat template, grammar) took longer than {budget:g} s "
                              f"(limits.grammar_timeout_s); simplify its tools, schema or grammar.",
                              code="request_too_complex") from None
    except asyncio.CancelledError:
        PREPARATION.cancel(job)
        raise


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

    @property
    def whole(self) -> bool:
        """A streamed reply's final chunk is made (it may not be sent yet)."""

    def tail(self) -> list[dict[str, Any]]:
        """What a stream sends after the model's last events: a usage chunk where the protocol has one and
        the client asked for it (chat's and the legacy route's `stream_options.include_usage`); nothing
        where usage rides in the final event (Responses, Messages)."""

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
                         call: Callable[[], Awaitable[T]], caller: Caller = ANONYMOUS) -> T:
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
                             cached_tokens=0, protocol=protocol, tenant=caller.tenant, batch=caller.batch)

    with recording(observer, record):
        try:
            async with asyncio.timeout(limits.request_timeout_s):
                done.append(await call())
        except TimeoutError:
            raise timeout_error(limits.request_timeout_s) from None
    return done[0]


RequestT = TypeVar("RequestT")
PlanT = TypeVar("PlanT")
ReplyT = TypeVar("ReplyT", bound=Reply)


class Generating(Protocol[RequestT, PlanT, ReplyT]):
    """What a generating protocol's service gives the lifecycle: how its request is planned, which reply it
    fills, which model events fill it, and what it keeps of an answered request."""

    @property
    def protocol(self) -> str:
        """The name its requests are recorded under (`llamaray_requests_total{protocol=...}`)."""

    def target(self, req: RequestT, caller: Caller) -> Target:
        """The request's base model and adapters: a 404 for a model or adapter not configured, or not the
        caller's to use."""

    async def plan(self, req: RequestT, caller: Caller) -> PlanT:
        """The request's plan; its errors are the client's and come before anything is recorded."""

    def reply(self, plan: PlanT, stream: bool) -> ReplyT:
        """A reply to fill from the plan's events, whole or streamed."""

    def events(self, plan: PlanT, reply: ReplyT) -> AsyncIterator[Any]:
        """The plan's model events in batches, until the reply is done or its deadline passes."""

    async def keep(self, req: RequestT, reply: ReplyT, caller: Caller) -> None:
        """Once per answered request, when its reply is whole and before the client has its end (the body,
        or a stream's final chunk): what the protocol keeps of it."""


async def plan_off_loop(limits: Limits, caller: Caller, make_plan: Callable[[Any, ModelSpec, str], PlanT], req: Any,
                        spec: ModelSpec, scope: str, attributes: Callable[[PlanT], dict[str, Any]]) -> PlanT:
    """`make_plan(req, spec, scope)` off the event loop (template rendering and grammar building are CPU
    work), within limits.grammar_timeout_s, in a `plan` span that says what it decided (`attributes`)."""
    return await traced("plan", off_loop(limits, caller, make_plan, req, spec, scope), attributes)


class Lifecycle(Generic[RequestT, PlanT, ReplyT]):
    """`complete` and `stream` of a generating service, over what it gives (`Generating`): planned, its
    events read into its reply, recorded once with how it ended."""

    def __init__(self, service: Generating[RequestT, PlanT, ReplyT], observer: RequestObserver | None = None) -> None:
        self.service = service
        self.observer = observer or NullObserver()

    def _record(self, target: Target, reply: ReplyT, stream: bool, failure: BaseException | None,
                caller: Caller) -> RequestRecord:
        rec = reply.record(self.service.protocol, stream, failure)
        if target.label or caller.tenant or caller.batch:
            return replace(rec, adapter=target.label, tenant=caller.tenant, batch=caller.batch)
        return rec

    async def complete(self, req: RequestT, caller: Caller = ANONYMOUS) -> dict[str, Any]:
        service = self.service
        plan = await service.plan(req, caller)
        target = service.target(req, caller)
        reply = service.reply(plan, False)
        with recording(self.observer, lambda failure: self._record(target, reply, False, failure, caller)):
            async for batch in service.events(plan, reply):
                reply.read(batch)
            reply.check()
            body = reply.body()
            await service.keep(req, reply, caller)
        return body

    async def stream(self, req: RequestT, caller: Caller = ANONYMOUS) -> AsyncIterator[list[dict[str, Any]]]:
        """Chunk batches; the first is empty: "accepted", planning passed (its errors are the client's
        and come before it), so the Ingress can answer with headers while the model is awaited."""
        service = self.service
        plan = await service.plan(req, caller)
        target = service.target(req, caller)
        reply = service.reply(plan, True)
        kept = False
        with recording(self.observer, lambda failure: self._record(target, reply, True, failure, caller)):
            yield []
            async for batch in service.events(plan, reply):
                out = reply.chunks(batch)
                if not kept and reply.whole:
                    await service.keep(req, reply, caller)
                    kept = True
                if out:
                    yield out
            tail = reply.tail()
            if tail:
                yield tail
