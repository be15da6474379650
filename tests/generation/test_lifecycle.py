"""The request lifecycle both generating services share (app/generation/lifecycle.py), run through each of them
over a fake model: a planning error asks no model and records nothing; every request that reached a model is
recorded exactly once with how it ended; a stream its reader drops or a cancelled request lets go of its
model stream; planning runs in a thread, within its budget."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from app.chat import ChatService
from app.completions import CompletionService
from app.api.errors import APIError
from app.api.schemas import CompletionRequest, parse_chat_request, parse_request
from app.config.app_args import Limits
from app.config.spec import ModelSpec
from app.engine.events import Finished, Started, Text
from app.observe.request_records import RequestRecord
from app.generation.lifecycle import recording

MODEL = "m"
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPEC = ModelSpec(id=MODEL, path="/nonexistent.gguf", n_ctx=512, n_seq_max=4, n_batch=64, n_threads=1,
                 n_threads_batch=1, n_gpu_layers=0, kv_unified=True, cpu_extra_buffers="auto",
                 startup_self_check=False, chat_template=TEMPLATE, bos_token="", eos_token="<|im_end|>",
                 reasoning_parser="auto", tool_parser="auto", default_max_tokens=None, max_tokens_limit=100,
                 stream_interval_ms=0, tool_continuation_rounds=0, tool_continuation_tokens=0,
                 owned_by="me", n_vocab=1000)
SERVICES = {"chat": ChatService, "completions": CompletionService}


class Records:
    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def record(self, rec: RequestRecord) -> None:
        self.records.append(rec)


class Model:
    """Says `words`, then finishes, or (`then`) raises it or hangs until closed. Counts its streams
    opened and closed."""

    def __init__(self, words: tuple[str, ...] = ("hello ", "world"), then: str | APIError = "finish") -> None:
        self.words, self.then = words, then
        self.opened = self.closed = self.said = 0  # streams; words yielded

    async def open_stream(self, model_id: str, gen):
        assert model_id == MODEL
        self.opened += 1
        try:
            yield [Started(3, 0)]
            for word in self.words:
                await asyncio.sleep(0)
                self.said += 1
                yield [Text(word, 1)]
            if isinstance(self.then, APIError):
                raise self.then
            if self.then == "hang":
                await asyncio.Event().wait()
            yield [Finished("stop", 3, len(self.words), 0)]
        finally:
            self.closed += 1


def request(protocol: str, stream: bool, **fields):
    if protocol == "chat":
        return parse_chat_request({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                   "stream": stream, **fields})
    return parse_request(CompletionRequest, {"model": MODEL, "prompt": "hi", "stream": stream, **fields})


def text_of(protocol: str, body_or_chunks) -> str:
    """The reply's text from a whole body or from a stream's chunks."""
    if isinstance(body_or_chunks, dict):
        choice = body_or_chunks["choices"][0]
        return choice["message"]["content"] if protocol == "chat" else choice["text"]
    parts = [c["choices"][0]["delta"].get("content") if protocol == "chat" else c["choices"][0]["text"]
             for c in body_or_chunks if c["choices"]]
    return "".join(p for p in parts if p)


async def run(service, req, stream: bool):
    """The whole body, or every chunk of the stream (the first batch, "accepted", must be empty)."""
    if not stream:
        return await service.complete(req)
    batches = [batch async for batch in service.stream(req)]
    assert batches[0] == []
    return [chunk for batch in batches[1:] for chunk in batch]


async def wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@pytest.fixture(params=sorted(SERVICES))
def protocol(request) -> str:
    return request.param


@pytest.fixture(params=[False, True], ids=["whole", "stream"])
def stream(request) -> bool:
    return request.param


def make(protocol: str, model: Model, **options) -> tuple[ChatService | CompletionService, Records]:
    records = Records()
    return SERVICES[protocol]([SPEC], model.open_stream, observer=records, **options), records


def test_an_answered_request_is_recorded_once(protocol, stream):
    model = Model()
    service, records = make(protocol, model)
    out = asyncio.run(run(service, request(protocol, stream), stream))
    assert text_of(protocol, out) == "hello world"
    [rec] = records.records
    assert (rec.model, rec.protocol, rec.stream, rec.status, rec.error_code) == (MODEL, protocol, stream, "ok", None)
    assert (rec.prompt_tokens, rec.completion_tokens) == (3, 2)
    assert model.closed == model.opened == 1


def test_usage_is_the_last_chunk_when_asked_for(protocol):
    service, _ = make(protocol, Model())
    chunks = asyncio.run(run(service, request(protocol, True, stream_options={"include_usage": True}), True))
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 2 and chunks[-1]["usage"]["prompt_tokens"] == 3


@pytest.mark.parametrize(("fields", "status", "code"), [
    ({"model": "nope"}, 404, "model_not_found"),
    ({"max_tokens": 101}, 400, None),  # over the model's max_tokens_limit: planning refuses it
], ids=["unknown-model", "max-tokens"])
def test_a_planning_error_asks_no_model_and_records_nothing(protocol, stream, fields, status, code):
    model = Model()
    service, records = make(protocol, model)
    with pytest.raises(APIError) as info:
        asyncio.run(run(service, request(protocol, stream, **fields), stream))
    assert info.value.status == status and (code is None or info.value.code == code)
    assert records.records == [] and model.opened == 0


def test_planning_runs_in_a_thread_within_its_budget(protocol, stream, monkeypatch):
    """Planning past limits.grammar_timeout_s is a 400 `request_too_complex`; the event loop runs meanwhile."""
    model = Model()
    service, records = make(protocol, model, limits=Limits(grammar_timeout_s=0.2))
    release, threads = threading.Event(), []

    def slow_plan(req, spec, scope):
        threads.append(threading.get_ident())
        release.wait(10)
        raise AssertionError("planning went on past its budget")

    monkeypatch.setattr(service, "make_plan", slow_plan)

    async def main() -> int:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(tick())
        try:
            with pytest.raises(APIError) as info:
                await run(service, request(protocol, stream), stream)
        finally:
            ticker.cancel()
            release.set()
        assert (info.value.status, info.value.code) == (400, "request_too_complex")
        return ticks

    assert asyncio.run(main()) > 5  # about 20 in the 0.2 s: the loop was not blocked
    assert threads and threads[0] != threading.get_ident()
    assert records.records == [] and model.opened == 0


def test_a_model_error_is_recorded_once_with_its_code(protocol, stream):
    model = Model(then=APIError("the model broke", status=500, type="server_error", code="model_broke"))
    service, records = make(protocol, model)
    seen: list[list[dict]] = []

    async def main() -> None:
        if not stream:
            await service.complete(request(protocol, False))
        async for batch in service.stream(request(protocol, True)):
            seen.append(batch)

    with pytest.raises(APIError) as info:
        asyncio.run(main())
    assert info.value.code == "model_broke"
    [rec] = records.records
    assert (rec.stream, rec.status, rec.error_code) == (stream, "error", "model_broke")
    assert rec.completion_tokens == 0 and rec.prompt_tokens == 3  # the words came, no round finished
    if stream:
        assert seen[0] == [] and text_of(protocol, [c for b in seen[1:] for c in b]) == "hello world"
    assert model.closed == model.opened == 1


def test_a_stream_its_reader_drops_is_recorded_cancelled_and_lets_go_of_the_model(protocol):
    model = Model(then="hang")
    service, records = make(protocol, model)

    async def main() -> None:
        events = service.stream(request(protocol, True))
        assert await anext(events) == []
        while model.said < len(model.words):
            await anext(events)
        await events.aclose()  # the client went away
        assert [r.status for r in records.records] == ["cancelled"]
        await wait_for(lambda: model.closed == model.opened == 1)

    asyncio.run(asyncio.wait_for(main(), 10))
    [rec] = records.records
    assert rec.stream and rec.error_code is None


def test_a_cancelled_request_is_recorded_cancelled_and_lets_go_of_the_model(protocol, stream):
    model = Model(then="hang")
    service, records = make(protocol, model)

    async def main() -> None:
        task = asyncio.ensure_future(run(service, request(protocol, stream), stream))
        await wait_for(lambda: model.said == len(model.words))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_for(lambda: model.closed == 1)

    asyncio.run(asyncio.wait_for(main(), 10))
    [rec] = records.records
    assert (rec.stream, rec.status) == (stream, "cancelled")


def test_recording_records_once_and_lets_the_exception_through():
    records = Records()
    failures: list[BaseException | None] = []

    def record(failure: BaseException | None) -> RequestRecord:
        failures.append(failure)
        return RequestRecord(model=MODEL, stream=False, status="x", error_code=None, duration_s=0.0, ttft_s=None,
                             itl_s=None, prompt_tokens=0, completion_tokens=0, cached_tokens=0)

    with recording(records, record):
        pass
    boom = ValueError("boom")
    with pytest.raises(ValueError) as info, recording(records, record):
        raise boom
    assert info.value is boom
    assert failures == [None, boom] and len(records.records) == 2


def test_a_batch_lines_planning_that_never_got_a_thread_is_a_retryable_503():
    """Batch work waits behind interactive jobs for the preparation threads: one whose budget passed before it got
    a thread is the server's 503 (the runner sends the line again), not the line's 400."""
    from app.generation.caller import Caller
    from app.generation.lifecycle import off_loop
    from app.tenants.prep_pool import PREPARATION

    release, busy = threading.Event(), threading.Semaphore(0)

    def hold() -> None:
        busy.release()
        release.wait(10)

    async def main() -> None:
        holders = [asyncio.ensure_future(PREPARATION.run(f"key{i // 2}", hold)) for i in range(PREPARATION.threads)]
        try:
            for _ in holders:
                assert await asyncio.to_thread(busy.acquire, True, 5)
            with pytest.raises(APIError) as info:
                await off_loop(Limits(grammar_timeout_s=0.2), Caller(batch=True), lambda: "planned")
            assert (info.value.status, info.value.code) == (503, "overloaded")
        finally:
            release.set()
            await asyncio.gather(*holders)
        assert await off_loop(Limits(grammar_timeout_s=5), Caller(batch=True), lambda: "planned") == "planned"
    asyncio.run(main())
