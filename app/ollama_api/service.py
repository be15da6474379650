"""/api/chat and /api/generate as adapters of the generation core (app/generation/core.py), as the Messages API
is: a request is mapped onto the chat request it means (mapping.py), planned, generated and read by the core, and
what was read is shaped as Ollama's records (shaping.py). `raw: true` on /api/generate is a legacy completion (the
prompt as it is: the completions service's planning and events) shaped the same way. A request that only loads its
model (no prompt, no messages) is answered by `keep_alive` (keep_alive.py) without generating."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..api.errors import APIError
from ..completions.service import CompletionPlan, CompletionService, plan_completion
from ..config.app_args import Limits
from ..config.spec import ModelSpec
from ..engine.events import Event, Finished, Started, Text
from ..generation.adapters import Target, reached_model, served_target, split_model
from ..generation.caller import ANONYMOUS, Caller, cache_scope
from ..generation.core import GenerationCore
from ..generation.lifecycle import Lifecycle, plan_off_loop
from ..generation.plan import GenerationPlan, grammar_limits
from ..generation.reading import Closed, Delta, ReplyReader
from ..generation.rounds import Generate
from ..generation.tally import ReplyTally
from ..grammar.request_grammars import json_grammar
from ..observe.request_records import RequestObserver, RequestRecord
from ..pools.admin import PoolAdmin
from ..tenants.access import may_use
from .keep_alive import KeepAlive
from .mapping import response_format, to_chat_request, to_completion_request
from .names import resolve_request
from .options import check_num_ctx, keep_alive_seconds, penalty_window, read_options
from .schemas import OllamaChatRequest, OllamaGenerateRequest, _Generating, _Named
from .shaping import (
    chat_record, final_fields, generate_record, load_record, message, ollama_tool_calls,
)

PROTOCOL = "ollama"
InnerPlan = TypeVar("InnerPlan", GenerationPlan, CompletionPlan)
NamedT = TypeVar("NamedT", bound=_Named)


def resolved(models: dict[str, ModelSpec], req: NamedT, caller: Caller) -> NamedT:
    """`req` naming the configured id its model name means (names.py), for the caller's key; Ollama's 404 else."""
    def known(name: str) -> bool:
        found = split_model(models, name)
        return found is not None and may_use(caller.policy, found[0].id, ((found[1], 1.0),) if found[1] else ())

    return resolve_request(req, known)


@dataclass(frozen=True)
class OllamaPlan(Generic[InnerPlan]):
    """A planned Ollama turn: the core's (or the completions') plan, and what its records need."""

    inner: InnerPlan
    req: _Generating
    received_at: float  # when the request reached the processing (total_duration counts from it)

    @property
    def chat(self) -> bool:
        return isinstance(self.req, OllamaChatRequest)


def _num_predict(exc: APIError) -> APIError:
    """A limit error about `max_tokens` named as the Ollama client set it (`options.num_predict`)."""
    if exc.param != "max_tokens":
        return exc
    return APIError(exc.message.replace("`max_tokens`", "`options.num_predict`"), param="options.num_predict",
                    code=exc.code, status=exc.status, type=exc.type)


_IMAGE_PART = re.compile(r"messages\[(\d+)\]\.content\[(\d+)\](?:\.image_url)?")


def _image_names(exc: APIError, req: _Generating) -> APIError:
    """An error about an image part (`messages[i].content[j]`: the chat request's) named as the client sent the
    image: `messages[i].images[j]` (images come first in their message's parts), or /api/generate's `images[j]`."""
    def named(match: re.Match[str]) -> str:
        i, j = int(match.group(1)), int(match.group(2))
        if isinstance(req, OllamaChatRequest):
            images = req.messages[i].images or [] if i < len(req.messages) else []
            return f"messages[{i}].images[{j}]" if j < len(images) else match.group(0)
        generated = req.images or []  # type: ignore[attr-defined]
        prompt_turn = 1 if req.system else 0  # type: ignore[attr-defined]
        return f"images[{j}]" if i == prompt_turn and j < len(generated) else match.group(0)

    if exc.param is None or not _IMAGE_PART.search(exc.param):
        return exc
    return APIError(_IMAGE_PART.sub(named, exc.message), param=_IMAGE_PART.sub(named, exc.param), code=exc.code,
                    status=exc.status, type=exc.type, headers=exc.headers)


class _Records:
    """What both replies share: the request's name and shape, the slot wait the engine reported, and the records."""

    def __init__(self, plan: OllamaPlan[Any], tally: ReplyTally) -> None:
        self.plan = plan
        self.tally = tally
        self.queued_s: float | None = None

    def saw(self, events: list[Any]) -> None:
        for ev in events:
            if isinstance(ev, Started) and self.queued_s is None:
                self.queued_s = ev.queued_s

    def line(self, text: str = "", thinking: str | None = None, calls: list[dict[str, Any]] | None = None,
             **fields: Any) -> dict[str, Any]:
        """One record of the reply (`fields`: the final record's)."""
        name = self.plan.req.name
        if self.plan.chat:
            return chat_record(name, message(text, thinking, calls), **fields)
        return generate_record(name, text, thinking, **fields)

    def final(self, finish_reason: str | None, text: str = "", thinking: str | None = None,
              calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return self.line(text, thinking, calls, **final_fields(self.tally, self.plan.received_at,
                                                                 self.queued_s or 0.0, finish_reason))


class TurnReply(_Records):
    """A templated turn (/api/chat, /api/generate): the core's reading of one choice as Ollama's records. A stream
    sends text and thinking as they are parsed, and a call whole, once its arguments are (Ollama's clients read
    `arguments` as an object)."""

    def __init__(self, plan: OllamaPlan[GenerationPlan]) -> None:
        self.reader = ReplyReader(plan.inner)
        super().__init__(plan, self.reader.choices[0].tally)
        self.calls: dict[int, dict[str, Any]] = {}  # a stream's calls by index, arguments as generated so far

    def read(self, batch: tuple[int, list[Event]]) -> None:
        self.saw(batch[1])
        self.reader.read(batch)

    def check(self) -> None:
        self.reader.check()

    def body(self) -> dict[str, Any]:
        result = self.reader.results()[0]
        msg = result.message
        calls = ollama_tool_calls(msg.get("tool_calls") or [])
        return self.final(result.finish_reason, msg.get("content") or "", msg.get("reasoning_content"), calls)

    def chunks(self, batch: tuple[int, list[Event]]) -> list[dict[str, Any]]:
        self.saw(batch[1])
        out = []
        for ev in self.reader.feed(batch):
            if isinstance(ev, Delta):
                delta = ev.delta
                if delta.get("content") or delta.get("reasoning_content"):
                    out.append(self.line(delta.get("content") or "", delta.get("reasoning_content")))
                for call in delta.get("tool_calls") or []:
                    self._call(call)
            elif isinstance(ev, Closed):
                if self.calls:
                    calls = [self.calls[i] for i in sorted(self.calls)]
                    out.append(self.line(calls=ollama_tool_calls(calls)))
                out.append(self.final(ev.finish_reason))
        return out

    def _call(self, part: dict[str, Any]) -> None:
        call = self.calls.setdefault(part.get("index", 0), {"id": None, "function": {"name": "", "arguments": ""}})
        if part.get("id") is not None:
            call["id"] = part["id"]
        fn = part.get("function") or {}
        if fn.get("name"):
            call["function"]["name"] = fn["name"]
        call["function"]["arguments"] += fn.get("arguments") or ""

    @property
    def whole(self) -> bool:
        return self.reader.ended

    def tail(self) -> list[dict[str, Any]]:
        return []  # the counts are in the final record

    def record(self, protocol: str, stream: bool, failure: BaseException | None) -> RequestRecord:
        return self.reader.record(protocol, stream, failure)


class RawReply(_Records):
    """A raw generation (the prompt as it is): the model's text, as it comes, as `response` records. Batches:
    [(prompt number, event)], as the completions service yields them."""

    def __init__(self, plan: OllamaPlan[CompletionPlan]) -> None:
        super().__init__(plan, ReplyTally())
        self.pieces: list[str] = []
        self.finish_reason: str | None = None

    def _take(self, batch: list[tuple[int, Event]], shaped: bool) -> list[dict[str, Any]]:
        self.saw([ev for _, ev in batch])
        out = []
        for _, ev in batch:
            if isinstance(ev, Text) and ev.text:
                self.pieces.append(ev.text)
                if shaped:
                    out.append(self.line(ev.text))
            elif isinstance(ev, Finished):
                self.finish_reason = ev.finish_reason
                if shaped:
                    out.append(self.final(ev.finish_reason))
        return out

    def read(self, batch: list[tuple[int, Event]]) -> None:
        self._take(batch, shaped=False)

    def check(self) -> None:
        """A raw generation is answered as it came out, however empty (as a legacy completion is)."""

    def body(self) -> dict[str, Any]:
        return self.final(self.finish_reason, "".join(self.pieces))

    def chunks(self, batch: list[tuple[int, Event]]) -> list[dict[str, Any]]:
        return self._take(batch, shaped=True)

    @property
    def whole(self) -> bool:
        return self.finish_reason is not None

    def tail(self) -> list[dict[str, Any]]:
        return []

    def record(self, protocol: str, stream: bool, failure: BaseException | None) -> RequestRecord:
        return self.tally.record(self.plan.inner.spec.id, stream, failure, protocol)


class _Turns:
    """The lifecycle's `Generating` for a templated turn: mapped to a chat request and planned by the core."""

    protocol = PROTOCOL

    def __init__(self, core: GenerationCore, keep_alive: KeepAlive) -> None:
        self.core = core
        self.keep_alive = keep_alive

    def target(self, req: _Generating, caller: Caller) -> Target:
        return self.core.target(req.model, _route(req), caller)

    def make_plan(self, req: _Generating, spec: ModelSpec, scope: str) -> GenerationPlan:
        """The request mapped and planned for `spec` (in a thread: pure CPU work)."""
        sampling = read_options(req.options)
        check_num_ctx(sampling, spec)
        mapped = to_chat_request(req, sampling)  # type: ignore[arg-type]
        try:
            plan = self.core.plan_chat(mapped.chat, spec, scope, mapped.template_kwargs)
        except APIError as exc:
            raise _num_predict(exc) from None
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
            raise _image_names(exc, req) from None
        return OllamaPlan(inner, req, received)

    def reply(self, plan: OllamaPlan[GenerationPlan], stream: bool) -> TurnReply:
        return TurnReply(plan)

    def events(self, plan: OllamaPlan[GenerationPlan], reply: TurnReply) -> AsyncIterator[tuple[int, list[Event]]]:
        return self.core.events(plan.inner, reply.reader)

    async def keep(self, req: Any, reply: Any, caller: Caller) -> None:
        """An Ollama turn keeps nothing."""


class _RawGenerations:
    """The lifecycle's `Generating` for `raw: true`: the completions service's planning (no template) and events."""

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
            raise _num_predict(exc) from None
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
        self.turns = Lifecycle(_Turns(core, self.keep_alive), observer)
        self.raw = Lifecycle(_RawGenerations(completions, limits, per_key_cache), observer)

    def _lifecycle(self, req: _Generating) -> Lifecycle[Any, Any, Any]:
        return self.raw if isinstance(req, OllamaGenerateRequest) and req.raw else self.turns

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

