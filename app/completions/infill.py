"""`POST /infill`: llama-server's fill-in-the-middle, as editors call it (llama.vim, llama.vscode, Continue, Tabby,
Twinny), over the request lifecycle every generating protocol shares. The prompt is laid out by the model's
replica from its vocabulary's FIM tokens (app/engine/infill.py); the reply is llama-server's /completion object
(`content`, `tokens_predicted`, `tokens_evaluated`, `stop_type`, `timings`...), or a stream of its partial objects
ending with the whole one (bare `data:` lines, no [DONE], as llama-server sends them).

The editors' own stops are read here, on the reply's text: `n_indent` (the first generated line indented less
ends the completion, cut before its text) and `t_max_predict_ms` (after the first new line, the completion ends
once it has run that long); either closes the generation, which frees its slot at once."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..api.errors import APIError, invalid_request
from ..api.infill import InfillRequest, nested_fields
from ..config.app_args import Limits
from ..config.spec import ModelSpec
from ..engine.events import Event, Finished, Started, Text
from ..engine.params import GenerationRequest, InfillPrompt, SamplingParams
from ..generation.adapters import Target, served_target
from ..generation.caller import ANONYMOUS, Caller, cache_scope
from ..generation.lifecycle import Lifecycle, plan_off_loop
from ..generation.plan import SAMPLING_FIELDS, check_completion_limit, client_gbnf, completion_limit
from ..generation.rounds import Generate, with_deadline
from ..generation.tally import ReplyTally
from ..observe.request_records import RequestObserver, RequestRecord


@dataclass(frozen=True)
class InfillPlan:
    req: InfillRequest
    spec: ModelSpec
    gen: GenerationRequest


def check_extra(req: InfillRequest, limits: Limits) -> None:
    """The other files' count, before the model's replica tokenizes any of them."""
    count = len(req.input_extra or ())
    if count > limits.max_infill_extra:
        raise invalid_request(f"`input_extra` has {count} files; this server takes at most {limits.max_infill_extra} "
                              f"in one request (limits.max_infill_extra).", param="input_extra", code="too_many_inputs")


def infill_sampling(req: InfillRequest) -> SamplingParams:
    """The request's sampling (llama-server's names, as the chat route's) over llama.cpp's defaults; its
    `samplers` list adds llama.cpp's infill sampler where it names it."""
    p = SamplingParams()
    for name in SAMPLING_FIELDS:
        value = getattr(req, name, None)
        if value is not None:
            setattr(p, name, value)
    p.infill = "infill" in (req.samplers or ())
    return p


def plan_infill(req: InfillRequest, spec: ModelSpec, limits: Limits, scope: str = "") -> InfillPlan:
    """One generation of the FIM prompt the model's replica lays out from the request's parts."""
    check_extra(req, limits)
    asked = None if req.n_predict is None or req.n_predict < 0 else req.n_predict
    check_completion_limit(asked, "n_predict", spec)
    sampling = infill_sampling(req)
    sampling.grammar = client_gbnf(req.grammar, limits)
    gen = GenerationRequest(
        request_id=uuid.uuid4().hex, prompt="", max_tokens=completion_limit(asked, spec), stop=req.stop_list,
        sampling=sampling, cache_scope=scope, cache_prompt=req.cache_prompt is not False,
        return_tokens=req.return_tokens,
        infill=InfillPrompt(prefix=req.input_prefix, suffix=req.input_suffix, extra=req.extra, prompt=req.prompt))
    return InfillPlan(req, spec, gen)


class EditorStops:
    """`n_indent` and `t_max_predict_ms` on the reply's text as it comes (llama-server's rules): `feed` gives the
    text kept of a piece, and whether the completion ends there."""

    def __init__(self, n_indent: int, t_max_predict_ms: int | None) -> None:
        self.n_indent = n_indent
        self.t_max_s = t_max_predict_ms / 1000 if t_max_predict_ms and t_max_predict_ms > 0 else None
        self.started: float | None = None
        self.has_new_line = False
        self.line_start = False  # at the start of a line after a new line: its indentation being counted
        self.indent = 0

    def feed(self, piece: str) -> tuple[str, bool]:
        now = time.monotonic()
        if self.started is None:
            self.started = now
        timed_out = self.t_max_s is not None and self.has_new_line and now - self.started > self.t_max_s
        if self.n_indent > 0:
            for i, ch in enumerate(piece):
                if self.line_start:
                    if ch in " \t":
                        self.indent += 1
                        continue
                    if self.indent < self.n_indent:
                        return piece[:i], True
                    self.line_start = False
                if ch == "\n":
                    self.line_start, self.indent = True, 0
        self.has_new_line = self.has_new_line or "\n" in piece
        return piece, timed_out


def stop_type(reason: str | None, word: str | None) -> str:
    if reason == "stop":
        return "word" if word else "eos"
    return "limit" if reason is not None else "none"


class InfillReply:
    """llama-server's /completion objects for one generation: the whole one, or the stream's partial ones and the
    whole one last."""

    def __init__(self, plan: InfillPlan, stream: bool) -> None:
        self.plan = plan
        self.stream = stream
        self.tally = ReplyTally()
        self.stops = EditorStops(plan.req.n_indent, plan.req.t_max_predict_ms)
        self.generated = 0      # tokens, from the Text events (a completion ended here has no Finished)
        self.token_ids: tuple[int, ...] = ()
        self.ended: str | None = None  # why it ended: the engine's finish reason, or "limit" for an editor's stop
        self.word: str | None = None

    @property
    def whole(self) -> bool:
        return self.ended is not None

    def _apply(self, ev: Event) -> str:
        """`ev` into the tallies; the text it adds to the reply."""
        if self.ended is not None:
            return ""
        if isinstance(ev, Started):
            self.tally.start(ev)
        elif isinstance(ev, Text):
            text, stop = self.stops.feed(ev.text)
            self.generated += ev.tokens
            if text:
                self.tally.add_text(text)
            if stop:
                self.ended = "limit"
                self.tally.completion_tokens = self.generated
                self.tally.finish_reason = "length"
            return text
        elif isinstance(ev, Finished):
            self.tally.end_round(ev)
            self.tally.finish_reason, self.tally.stop_sequence = ev.finish_reason, ev.stop_sequence
            self.ended, self.word, self.token_ids = ev.finish_reason, ev.stop_sequence, ev.token_ids
        return ""

    def read(self, batch: list[Event]) -> None:
        for ev in batch:
            self._apply(ev)

    def check(self) -> None:
        """A completion is answered as it came out, however empty."""

    def body(self, streamed: bool = False) -> dict[str, Any]:
        req, t = self.plan.req, self.tally
        text = "" if streamed else t.text()
        body = {
            "index": 0, "content": text, "tokens": list(self.token_ids), "id_slot": -1, "stop": True,
            "model": self.plan.spec.id if req.model is None else req.model,
            "tokens_predicted": t.completion_tokens, "tokens_evaluated": t.prompt_tokens,
            "generation_settings": self._settings(), "has_new_line": "\n" in t.text(), "truncated": False,
            "stop_type": stop_type(self.ended if self.ended != "limit" else "length", self.word),
            "stopping_word": self.word or "", "tokens_cached": t.cached_tokens, "timings": self._timings(),
        }
        return nested_fields(req.response_fields, body) if req.response_fields else body

    def chunks(self, batch: list[Event]) -> list[dict[str, Any]]:
        out = []
        for ev in batch:
            was = self.ended
            text = self._apply(ev)
            if text:
                out.append({"index": 0, "content": text, "tokens": [], "stop": False, "id_slot": -1,
                            "tokens_predicted": self.generated, "tokens_evaluated": self.tally.prompt_tokens})
            if was is None and self.ended is not None:
                out.append(self.body(streamed=True))
        return out

    def tail(self) -> list[dict[str, Any]]:
        return []

    def record(self, protocol: str, stream: bool, failure: BaseException | None) -> RequestRecord:
        return self.tally.record(self.plan.spec.id, stream, failure, protocol)

    def _settings(self) -> dict[str, Any]:
        req, gen = self.plan.req, self.plan.gen
        p = gen.sampling
        return {"n_predict": -1 if gen.max_tokens is None else gen.max_tokens, "seed": p.seed,
                "temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p,
                "repeat_penalty": p.repeat_penalty, "presence_penalty": p.presence_penalty,
                "frequency_penalty": p.frequency_penalty, "stop": list(gen.stop), "stream": self.stream,
                "n_indent": req.n_indent, "t_max_predict_ms": req.t_max_predict_ms or -1,
                "samplers": list(req.samplers) if req.samplers is not None else [], "cache_prompt": gen.cache_prompt}

    def _timings(self) -> dict[str, Any]:
        """llama-server's `timings`, measured where the reply is read: the prompt's from the request's start to
        its first text (its wait for a slot included), the prediction's from there to its last text."""
        t = self.tally
        first = t.first_text_at if t.first_text_at is not None else time.monotonic()
        last = t.last_text_at if t.last_text_at is not None else first
        prompt_n = max(0, t.prompt_tokens - t.cached_tokens)
        prompt_ms, predicted_ms = (first - t.t0) * 1000, (last - first) * 1000
        predicted_n = t.completion_tokens

        def rate(n: int, ms: float) -> tuple[float, float]:
            return (ms / n if n else 0.0), (1000 * n / ms if ms > 0 else 0.0)

        prompt_per_token, prompt_per_s = rate(prompt_n, prompt_ms)
        predicted_per_token, predicted_per_s = rate(predicted_n, predicted_ms)
        return {"cache_n": t.cached_tokens, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
                "prompt_per_token_ms": prompt_per_token, "prompt_per_second": prompt_per_s,
                "predicted_n": predicted_n, "predicted_ms": predicted_ms,
                "predicted_per_token_ms": predicted_per_token, "predicted_per_second": predicted_per_s}


class InfillService:
    """`/infill`: a fill-in-the-middle completion as llama-server answers it, recorded under the protocol `infill`."""

    protocol = "infill"

    def __init__(self, specs: list[ModelSpec], generate: Generate, *, limits: Limits | None = None,
                 observer: RequestObserver | None = None, per_key_cache: bool = True) -> None:
        self.models = {s.id: s for s in specs}
        self.generate = generate
        self.limits = limits or Limits()
        self.per_key_cache = per_key_cache
        self.lifecycle: Lifecycle[InfillRequest, InfillPlan, InfillReply] = Lifecycle(self, observer)

    def target(self, req: InfillRequest, caller: Caller) -> Target:
        if req.model is None:  # the Ingress names the only chat model the key may use, or refuses
            raise invalid_request("`model` is required.", param="model", code="missing_required_parameter")
        return served_target(self.models, req.model, "chat", "/infill", req.lora, caller.policy)

    def make_plan(self, req: InfillRequest, spec: ModelSpec, scope: str) -> InfillPlan:
        return plan_infill(req, spec, self.limits, scope)

    async def plan(self, req: InfillRequest, caller: Caller = ANONYMOUS) -> InfillPlan:
        target = self.target(req, caller)
        scope = cache_scope(caller, req.cache_salt, self.per_key_cache)
        plan = await plan_off_loop(self.limits, caller, self.make_plan, req, target.spec, scope, plan_attributes)
        plan.gen.adapters = target.adapters or plan.gen.adapters
        plan.gen.tenant, plan.gen.weight = caller.tenant, caller.weight
        return plan

    def reply(self, plan: InfillPlan, stream: bool) -> InfillReply:
        return InfillReply(plan, stream)

    async def keep(self, req: InfillRequest, reply: InfillReply, caller: Caller) -> None:
        """A completion keeps nothing."""

    async def complete(self, req: InfillRequest, caller: Caller = ANONYMOUS) -> dict[str, Any]:
        return await self.lifecycle.complete(req, caller)

    def stream(self, req: InfillRequest, caller: Caller = ANONYMOUS) -> AsyncIterator[list[dict[str, Any]]]:
        return self.lifecycle.stream(req, caller)

    async def events(self, plan: InfillPlan, reply: InfillReply) -> AsyncIterator[list[Event]]:
        """The generation's events until it finished, an editor's stop ended it (the generation is closed, which
        frees its slot), or the deadline passed (504)."""
        timeout_s = self.limits.request_timeout_s
        source = with_deadline(self.generate(plan.spec.id, plan.gen), time.monotonic() + timeout_s, timeout_s)
        try:
            async for batch in source:
                yield batch
                if reply.ended is not None:
                    return
        except APIError as exc:
            if exc.code == "context_length_exceeded" and exc.param == "messages":
                # The prompt's parts were cut to fit (as llama-server cuts them): what is left is the completion's.
                message = exc.message.replace("your messages", "the fill-in-the-middle prompt").replace(
                    "the messages", "the prompt").replace("length of the messages or completion", "`n_predict`")
                raise APIError(message, param="n_predict", code=exc.code, status=exc.status, type=exc.type,
                               headers=exc.headers) from None
            raise
        finally:
            await source.aclose()
        raise APIError("The model stream ended without finishing.", status=502, type="server_error",
                       code="incomplete_generation")


def plan_attributes(plan: InfillPlan) -> dict[str, Any]:
    """What planning decided, for its span."""
    infill = plan.gen.infill
    return {"llamaray.infill_files": len(infill.extra) if infill is not None else 0}
