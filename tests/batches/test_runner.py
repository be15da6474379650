"""The batch runner's logic without Ray (app/batches/runner.py), over a store in a temporary folder and a fake
processing: a batch runs to its end with OpenAI's output and error files; a line that fails is retried by a
client's rules; a runner stopped anywhere and started again answers each custom_id exactly once; a cancel and the
end of the window keep what was answered; one bad line fails an OpenAI batch naming it, while a Message Batch
answers it errored; lines sent back for interactive work narrow the model's window."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from app.api.errors import APIError, invalid_request, service_unavailable
from app.batches.endpoints import ENDPOINTS
from app.batches.files import begin_upload
from app.batches.records import BatchRecord, batch_dir, batch_record_path
from app.batches.results import ResultChunks
from app.batches.runner import BatchRunner, KeyRevoked, ModelWindow
from app.batches.schemas import CancelBatchRequest, CreateBatchRequest, CreateMessageBatchRequest
from app.batches.service import BatchService
from app.generation.caller import Caller
from app.tenants.policies import KeyPolicy, key_hash
from tests.batches.conftest import CHAT, SPECS, chat_line, jsonl

KEY = KeyPolicy(name="team", key_sha256=key_hash("sk-team"))
CALLER = Caller(key_id="0123456789abcdef", policy=KEY)


def completion(content: str) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": CHAT,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


class FakeProcessing:
    """`respond` as the processing answers: each line's content picks its fate (`fail:<status>:<code>` fails
    once, `always:<status>:<code>` every time, `slow` waits for `gate`)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.callers: list[Caller] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.failed_once: set[str] = set()

    async def respond(self, request: Any, caller: Caller) -> Any:
        content = request.messages[-1].content
        self.calls[content] += 1
        self.callers.append(caller)
        if content.startswith("slow"):
            await self.gate.wait()
        kind, _, rest = content.partition(":")
        if kind in ("fail", "always") and (kind == "always" or content not in self.failed_once):
            self.failed_once.add(content)
            status, _, code = rest.partition(":")
            raise APIError(f"{code} for {content}", status=int(status), code=code, type="x",
                           headers={"retry-after": "0.01"})
        return completion(f"re: {content}")


async def upload(store, config, data: bytes) -> str:
    def write() -> str:
        up = begin_upload(store, config, "0123456789abcdef")
        up.write(data)
        return up.commit("in.jsonl", "batch").id
    return await asyncio.to_thread(write)


async def until(predicate, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, f"no {what}"
        await asyncio.sleep(0.02)


def runner_of(store, config, fake: FakeProcessing, **kwargs) -> BatchRunner:
    return BatchRunner(store, config, SPECS, fake.respond, kwargs.pop("policy_of", lambda record: KEY),
                       max_line_bytes=1 << 20, **kwargs)


async def record_of(store, batch_id: str) -> BatchRecord:
    blob = await asyncio.to_thread(store.get, batch_record_path("0123456789abcdef", batch_id))
    return BatchRecord.from_json(blob)


async def ended(store, batch_id: str) -> BatchRecord:
    async def done() -> bool:
        return (await record_of(store, batch_id)).ended
    await until(done, f"end of {batch_id}")
    return await record_of(store, batch_id)


async def file_lines(store, record: BatchRecord, which: str) -> list[dict[str, Any]]:
    file_id = getattr(record, f"{which}_file_id")
    if file_id is None:
        return []
    blob = await asyncio.to_thread(store.get, f"keys/{record.owner}/files/{file_id}.data")
    return [json.loads(line) for line in blob.splitlines()]


async def make_batch(store, config, lines: list[Any]) -> str:
    file_id = await upload(store, config, jsonl(lines))
    service = BatchService(store, config)
    body = await service.create(CreateBatchRequest(input_file_id=file_id, endpoint="/v1/chat/completions",
                                                   completion_window="24h"), CALLER)
    assert body["status"] == "validating"
    return body["id"]


def test_a_batch_runs_to_its_end_each_line_answered_once_in_openai_files(store, config):
    async def main():
        fake = FakeProcessing()
        lines = [chat_line(f"id-{i}", f"q{i}") for i in range(5)]
        lines += [chat_line("retried", "fail:503:overloaded_x"), chat_line("refused", "always:400:bad"),
                  chat_line("gave-up", "always:502:upstream")]
        batch_id = await make_batch(store, config, lines)
        runner = runner_of(store, config, fake)
        runner.submit("0123456789abcdef", batch_id)
        record = await ended(store, batch_id)
        assert record.status == "completed" and record.total == 8
        body = record.to_openai()
        assert body["request_counts"] == {"total": 8, "completed": 6, "failed": 2}
        assert body["usage"]["input_tokens"] == 18 and body["usage"]["output_tokens"] == 12
        output = await file_lines(store, record, "output")
        errors = await file_lines(store, record, "error")
        assert sorted(o["custom_id"] for o in output) == sorted([f"id-{i}" for i in range(5)] + ["retried"])
        assert all(o["response"]["status_code"] == 200 and o["error"] is None for o in output)
        assert output[0]["response"]["body"]["object"] == "chat.completion"
        by_id = {e["custom_id"]: e for e in errors}
        assert by_id["refused"]["response"]["status_code"] == 400
        assert by_id["refused"]["response"]["body"]["error"]["code"] == "bad"
        assert by_id["gave-up"]["response"]["status_code"] == 502
        assert fake.calls["always:400:bad"] == 1  # a 400 is final
        assert fake.calls["always:502:upstream"] == config.max_attempts
        assert fake.calls["fail:503:overloaded_x"] == 2
        assert all(c.batch and c.key_id == "0123456789abcdef" and c.policy == KEY for c in fake.callers)
        await runner.close()
    asyncio.run(main())


def test_a_runner_stopped_mid_batch_resumes_and_answers_each_line_exactly_once(store, config):
    async def main():
        fake = FakeProcessing()
        lines = [chat_line(f"fast-{i}", f"q{i}") for i in range(6)] + [chat_line(f"slow-{i}", f"slow{i}")
                                                                        for i in range(4)]
        batch_id = await make_batch(store, config, lines)
        fake.gate.clear()
        first = runner_of(store, config, fake, lines_per_model={CHAT: 16})  # the slow lines hold no fast one back
        first.submit("0123456789abcdef", batch_id)
        chunks = ResultChunks(store, "0123456789abcdef", batch_id)

        async def fast_written() -> bool:
            return len((await asyncio.to_thread(chunks.answered)).lines) >= 6
        await until(fast_written, "the fast lines written")
        await first.close()  # the actor dies: the slow lines in flight are lost with it
        await asyncio.sleep(0.05)
        assert not (await record_of(store, batch_id)).ended
        # An old runner's chunk that also answered a line the new one will answer (two runners at once).
        stale = ResultChunks(store, "0123456789abcdef", batch_id)
        await asyncio.to_thread(stale.answered)
        done = {r.line: r for r in await asyncio.to_thread(lambda: list(chunks.results()))}
        await asyncio.to_thread(stale.write, [replace(next(iter(done.values())), request_id="stale")])
        fake.gate.set()
        second = runner_of(store, config, fake)
        second.submit("0123456789abcdef", batch_id)
        record = await ended(store, batch_id)
        output = await file_lines(store, record, "output")
        ids = [o["custom_id"] for o in output]
        assert sorted(ids) == sorted(line["custom_id"] for line in lines)  # each exactly once
        assert "batch_req_stale" not in {o["id"] for o in output}  # the first chunk's answer is the one kept
        assert all(fake.calls[f"q{i}"] == 1 for i in range(6))  # answered lines were not sent again
        assert record.to_openai()["request_counts"] == {"total": 10, "completed": 10, "failed": 0}
        await second.close()
    asyncio.run(main())


def test_a_cancel_keeps_the_answered_lines_and_answers_the_rest_cancelled(store, config):
    async def main():
        fake = FakeProcessing()
        fake.gate.clear()
        lines = [chat_line(f"a{i}", f"q{i}") for i in range(3)] + [chat_line(f"s{i}", f"slow{i}") for i in range(5)]
        batch_id = await make_batch(store, config, lines)
        service = BatchService(store, config)
        runner = runner_of(store, config, fake, lines_per_model={CHAT: 16})
        runner.submit("0123456789abcdef", batch_id)

        async def some_answered() -> bool:
            return (await record_of(store, batch_id)).counts["succeeded"] >= 3
        await until(some_answered, "answers before the cancel")
        started = time.monotonic()
        body = await service.cancel(CancelBatchRequest(batch_id), CALLER)
        assert body["status"] == "cancelling" and "cancelling_at" in body
        runner.cancel("0123456789abcdef", batch_id)
        record = await ended(store, batch_id)
        assert time.monotonic() - started < 5
        assert record.status == "cancelled"
        output = await file_lines(store, record, "output")
        errors = await file_lines(store, record, "error")
        assert sorted(o["custom_id"] for o in output) == ["a0", "a1", "a2"]
        assert sorted(e["custom_id"] for e in errors) == [f"s{i}" for i in range(5)]
        assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
        await runner.close()
    asyncio.run(main())


def test_the_end_of_the_window_expires_the_rest_and_keeps_what_was_done(store, config):
    async def main():
        fake = FakeProcessing()
        fake.gate.clear()
        short = config.model_copy(update={"completion_window_s": 1.0})
        lines = [chat_line("done", "q"), chat_line("late", "slow")]
        batch_id = await make_batch(store, short, lines)
        runner = runner_of(store, short, fake)
        runner.submit("0123456789abcdef", batch_id)
        record = await ended(store, batch_id)
        assert record.status == "expired"
        assert [o["custom_id"] for o in await file_lines(store, record, "output")] == ["done"]
        errors = await file_lines(store, record, "error")
        assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("late", "batch_expired")]
        assert "expired_at" in record.to_openai()
        await runner.close()
    asyncio.run(main())


def test_one_bad_line_fails_an_openai_batch_naming_it_before_anything_runs(store, config):
    async def main():
        fake = FakeProcessing()
        batch_id = await make_batch(store, config, [chat_line("a"), b"{not json", chat_line("c", model="nope")])
        runner = runner_of(store, config, fake)
        runner.submit("0123456789abcdef", batch_id)
        record = await ended(store, batch_id)
        body = record.to_openai()
        assert body["status"] == "failed" and "failed_at" in body
        assert [(e["line"], e["code"]) for e in body["errors"]["data"]] == [(2, "invalid_json_line"),
                                                                           (3, "model_not_found")]
        assert not fake.calls
        await runner.close()
    asyncio.run(main())


def test_a_message_batch_answers_a_bad_request_errored_and_runs_the_rest(store, config):
    async def main():
        fake = FakeProcessing()
        good = {"custom_id": "g", "method": "POST", "url": "/v1/messages",
                "body": {"model": CHAT, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}}
        bad = {**good, "custom_id": "b", "body": {"model": CHAT, "messages": "no"}}
        service = BatchService(store, config)
        batch_id = "msgbatch_" + "0" * 12 + "a" * 20
        await asyncio.to_thread(store.put, f"{batch_dir('0123456789abcdef', batch_id)}/input.jsonl",
                                jsonl([good, bad]))
        body = await service.create_message_batch(CreateMessageBatchRequest(batch_id, 2), CALLER)
        assert body["processing_status"] == "in_progress" and body["results_url"] is None

        async def respond(request, caller):
            fake.calls["messages"] += 1
            return {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": CHAT,
                    "stop_reason": "end_turn", "usage": {"input_tokens": 2, "output_tokens": 1}}
        runner = BatchRunner(store, config, SPECS, respond, lambda record: KEY, max_line_bytes=1 << 20)
        runner.submit("0123456789abcdef", batch_id)
        record = await ended(store, batch_id)
        shown = record.to_anthropic()
        assert shown["processing_status"] == "ended" and shown["results_url"].endswith(f"{batch_id}/results")
        assert shown["request_counts"] == {"processing": 0, "succeeded": 1, "errored": 1, "canceled": 0,
                                           "expired": 0}
        results = {r.custom_id: r.to_anthropic() for r in ResultChunks(store, record.owner, batch_id).results()}
        assert results["g"]["result"]["type"] == "succeeded"
        assert results["b"]["result"]["type"] == "errored"
        assert results["b"]["result"]["error"]["type"] == "error"  # Anthropic's error shape
        assert record.output_file_id is None  # a Message Batch's results are read from its chunks
        await runner.close()
    asyncio.run(main())


def test_rate_limits_are_waited_out_and_a_spent_budget_is_final(store, config):
    async def main():
        fake = FakeProcessing()
        lines = [chat_line("paced", "fail:429:rate_limit_exceeded"), chat_line("broke", "always:429:insufficient_quota")]
        batch_id = await make_batch(store, config, lines)
        runner = runner_of(store, config, fake)
        runner.submit("0123456789abcdef", batch_id)
        record = await ended(store, batch_id)
        assert [o["custom_id"] for o in await file_lines(store, record, "output")] == ["paced"]
        errors = await file_lines(store, record, "error")
        assert errors[0]["response"]["status_code"] == 429
        assert errors[0]["response"]["body"]["error"]["code"] == "insufficient_quota"
        assert fake.calls["always:429:insufficient_quota"] == 1
        await runner.close()
    asyncio.run(main())


def test_a_revoked_key_stops_its_lines(store, config):
    async def main():
        fake = FakeProcessing()
        batch_id = await make_batch(store, config, [chat_line("a")])

        def revoked(record):
            raise KeyRevoked("gone")
        runner = runner_of(store, config, fake, policy_of=revoked)
        runner.submit("0123456789abcdef", batch_id)
        record = await ended(store, batch_id)
        assert record.status == "failed" and record.errors[0]["code"] == "invalid_api_key"
        assert not fake.calls
        await runner.close()
    asyncio.run(main())


def test_lines_sent_back_for_interactive_work_narrow_the_window_then_it_widens_again():
    async def main():
        window = ModelWindow(8)
        for _ in range(3):
            await window.acquire()
        window.release(yielded=True)
        assert window.size == 4
        window.release(yielded=True)
        window.release(yielded=True)
        assert window.size == 1 and window.in_flight == 0
        await window.acquire()
        blocked = asyncio.ensure_future(window.acquire())
        await asyncio.sleep(0.01)
        assert not blocked.done()  # one in flight, a window of one
        window.release(yielded=False)  # an answer: the window grows
        await asyncio.wait_for(blocked, 1)
        assert window.size == 2
    asyncio.run(main())


def test_a_model_sending_lines_back_is_retried_without_spending_tries(store, config):
    async def main():
        sent_back = {"n": 0}

        async def respond(request, caller):
            if sent_back["n"] < 4:
                sent_back["n"] += 1
                raise service_unavailable("busy", code="batch_preempted")
            return completion("ok")
        batch_id = await make_batch(store, config, [chat_line("a")])
        runner = BatchRunner(store, config, SPECS, respond, lambda record: KEY, max_line_bytes=1 << 20)
        runner.submit("0123456789abcdef", batch_id)
        record = await ended(store, batch_id)
        assert record.counts["succeeded"] == 1  # four times sent back, more than max_attempts: never counted
        await runner.close()
    asyncio.run(main())


def test_validation_and_refusals_are_in_the_protocol_shape():
    assert ENDPOINTS["/v1/chat/completions"].errors(invalid_request("no", param="x"))[1]["error"]["param"] == "x"


@pytest.mark.parametrize("status", ["completed", "failed", "expired"])
def test_an_ended_batch_cannot_be_cancelled(store, config, status):
    async def main():
        batch_id = await make_batch(store, config, [chat_line("a")])
        record = await record_of(store, batch_id)
        record.set_status(status)
        await asyncio.to_thread(store.put, batch_record_path(record.owner, batch_id), record.to_json())
        with pytest.raises(APIError) as refused:
            await BatchService(store, config).cancel(CancelBatchRequest(batch_id), CALLER)
        assert refused.value.status == 409
    asyncio.run(main())
