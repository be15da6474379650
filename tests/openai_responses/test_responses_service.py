"""ResponsesService on the real engine (no Ray): response objects and typed event streams validated against
OpenAI's spec, the store's use (previous_response_id, owners), and input token counts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.api.errors import APIError
from app.engine import GenerationRequest
from app.engine.jobs import TokenizeJob
from tests.support.engine_errors import mapped_stream
from app.openai_responses.schemas import (
    parse_input_tokens_request,
    parse_responses_request,
)
from app.openai_responses.service import InputTokensService, ResponsesService
from app.openai_responses.store import MemoryResponseStore
from app.prompt.content_marks import clean
from app.generation.caller import Caller
from tests.support.events import run_until_idle as run
from tests.support.openapi_spec import assert_valid
from tests.support.responses_events import assert_valid_event

pytestmark = pytest.mark.timeout(300)

ALICE, BOB = Caller("alice"), Caller("bob")
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}}


class Models:
    def __init__(self, engine) -> None:
        self.engine = engine
        self.opened: list[GenerationRequest] = []

    async def generate(self, model_id: str, gen: GenerationRequest):
        self.opened.append(gen)
        async for batch in mapped_stream(self.engine, gen, 0):
            yield batch

    async def run(self, model_id: str, job: TokenizeJob) -> list[int]:
        return self.engine.tokenize(job.text, job.add_special)


@pytest.fixture(scope="module")
def models(engine) -> Models:
    return Models(engine)


@pytest.fixture
def store() -> MemoryResponseStore:
    return MemoryResponseStore()


@pytest.fixture
def service(bundled_spec, models, store) -> ResponsesService:
    return ResponsesService([bundled_spec], models.generate, response_store=store)


def request(spec, **fields) -> Any:
    return parse_responses_request({"model": spec.id, "input": "Say hello.", "temperature": 0,
                                    "max_output_tokens": 8, **fields})


async def collect(stream) -> list[dict[str, Any]]:
    assert await anext(stream) == []
    events = []
    async for batch in stream:
        assert batch
        events.extend(batch)
    return events


def check_stream(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Every event valid, numbered 0.., opened by created/in_progress, closed by one final event."""
    for event in events:
        assert_valid_event(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    assert sum(e["type"] in ("response.completed", "response.incomplete") for e in events) == 1
    return events[-1]["response"]


def test_complete_is_a_valid_response(service, engine, bundled_spec, store):
    body = run(engine, service.complete(request(bundled_spec, metadata={"k": "v"}), ALICE))
    assert_valid("Response", body)
    assert body["id"].startswith("resp_") and body["object"] == "response"
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    (message,) = body["output"]
    assert message["type"] == "message" and message["status"] == "incomplete"
    assert message["content"][0]["text"] and body["output_text"] == message["content"][0]["text"]
    assert body["usage"]["output_tokens"] == 8 and body["usage"]["input_tokens"] > 0
    assert body["usage"]["total_tokens"] == body["usage"]["input_tokens"] + 8
    assert body["metadata"] == {"k": "v"} and body["max_output_tokens"] == 8 and body["store"] is True
    entry = run(engine, store.get(ALICE.key_id, body["id"]))
    assert entry["response"] == body
    assert entry["conversation"] == [{"role": "user", "content": "Say hello."},
                                     {"role": "assistant", "content": message["content"][0]["text"]}]


def test_store_false_keeps_nothing(service, engine, bundled_spec, store):
    body = run(engine, service.complete(request(bundled_spec, store=False), ALICE))
    assert body["store"] is False
    assert run(engine, store.get(ALICE.key_id, body["id"])) is None


def test_stream_equals_complete_for_a_seeded_request(service, engine, bundled_spec):
    fields = {"temperature": 0.7, "seed": 42, "max_output_tokens": 12}
    whole = run(engine, service.complete(request(bundled_spec, **fields), ALICE))
    events = run(engine, collect(service.stream(request(bundled_spec, stream=True, **fields), ALICE)))
    final = check_stream(events)
    assert_valid("Response", final)
    assert final["output_text"] == whole["output_text"] and final["usage"] == whole["usage"]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == whole["output_text"]
    assert [e["type"] for e in events if "output_item" in e["type"] or "content_part" in e["type"]] == [
        "response.output_item.added", "response.content_part.added", "response.content_part.done",
        "response.output_item.done"]


def test_previous_response_id_continues_the_stored_conversation(service, models, engine, bundled_spec):
    first = run(engine, service.complete(request(bundled_spec, instructions="Be brief."), ALICE))
    models.opened.clear()
    second = run(engine, service.complete(request(bundled_spec, input="And again?",
                                                  previous_response_id=first["id"]), ALICE))
    assert second["previous_response_id"] == first["id"] and second["instructions"] is None
    prompt = models.opened[0].prompt
    # the first turn, its reply and the new input, without the first turn's instructions
    assert "Say hello." in prompt and first["output_text"] in prompt and "And again?" in prompt
    assert "Be brief." not in prompt


def test_the_rendered_follow_up_extends_the_previous_prompt(service, models, engine, bundled_spec):
    # what keeps a follow-up on the replica (and the cache) holding its prefix
    first = run(engine, service.complete(request(bundled_spec, instructions="Be brief.", max_output_tokens=4), ALICE))
    first_prompt = models.opened[-1].prompt
    run(engine, service.complete(request(bundled_spec, instructions="Be brief.", input="More.",
                                         previous_response_id=first["id"]), ALICE))
    # as the model reads them (content marks are not tokens)
    assert clean(models.opened[-1].prompt).startswith(clean(first_prompt) + first["output_text"])


def test_previous_response_of_another_key_or_unknown_is_404(service, engine, bundled_spec):
    first = run(engine, service.complete(request(bundled_spec), ALICE))
    for caller, rid in ((BOB, first["id"]), (ALICE, "resp_unknown")):
        with pytest.raises(APIError) as err:
            run(engine, service.complete(request(bundled_spec, previous_response_id=rid), caller))
        assert (err.value.status, err.value.code, err.value.param) == (404, "not_found", "previous_response_id")


def test_forced_function_call_round_trip(service, engine, bundled_spec):
    first = run(engine, service.complete(request(bundled_spec, input="Weather in Paris?", tools=[WEATHER],
                                                 tool_choice="required", max_output_tokens=60), ALICE))
    assert_valid("Response", first)
    (call,) = [i for i in first["output"] if i["type"] == "function_call"]
    assert call["name"] == "get_weather" and isinstance(json.loads(call["arguments"])["city"], str)
    assert first["status"] == "completed"
    follow = request(bundled_spec, tools=[WEATHER], previous_response_id=first["id"], max_output_tokens=6,
                     input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}])
    second = run(engine, service.complete(follow, ALICE))
    assert_valid("Response", second)
    assert second["output"][0]["type"] == "message"


def test_streamed_call_arguments_arrive_as_generated(service, engine, bundled_spec):
    req = request(bundled_spec, input="Weather in Paris?", tools=[WEATHER], max_output_tokens=60, stream=True,
                  tool_choice={"type": "function", "name": "get_weather"})
    events = run(engine, collect(service.stream(req, ALICE)))
    final = check_stream(events)
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    (done,) = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert len(deltas) > 1 and "".join(deltas) == done["arguments"]
    (call,) = [i for i in final["output"] if i["type"] == "function_call"]
    assert call["arguments"] == done["arguments"] and json.loads(call["arguments"])["city"]


def test_json_schema_format(service, engine, bundled_spec):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    body = run(engine, service.complete(request(bundled_spec, max_output_tokens=40, text={
        "format": {"type": "json_schema", "name": "num", "schema": schema, "strict": True}}), ALICE))
    assert_valid("Response", body)
    assert isinstance(json.loads(body["output_text"])["n"], int)
    assert body["text"]["format"]["type"] == "json_schema"


def test_planning_errors_name_the_responses_field(service, engine, bundled_spec):
    with pytest.raises(APIError) as err:
        run(engine, service.complete(request(bundled_spec, max_output_tokens=10**6), ALICE))
    assert err.value.param == "max_output_tokens"


def test_input_tokens_count_the_generated_prompt(service, models, engine, bundled_spec):
    counter = InputTokensService(service, models)
    fields = {"model": bundled_spec.id, "input": "Count me.", "instructions": "Be brief."}
    counted = run(engine, counter.complete(parse_input_tokens_request(fields), ALICE))
    body = run(engine, service.complete(request(bundled_spec, **fields), ALICE))
    assert counted == {"object": "response.input_tokens", "input_tokens": body["usage"]["input_tokens"]}


class Records:
    def __init__(self) -> None:
        self.records = []

    def record(self, rec) -> None:
        self.records.append(rec)


def test_requests_are_recorded_under_the_responses_protocol(bundled_spec, models, engine):
    observer = Records()
    service = ResponsesService([bundled_spec], models.generate, observer=observer)
    run(engine, service.complete(request(bundled_spec, max_output_tokens=2), ALICE))
    run(engine, collect(service.stream(request(bundled_spec, max_output_tokens=2, stream=True), ALICE)))
    assert [(r.protocol, r.stream, r.status, r.completion_tokens) for r in observer.records] == [
        ("responses", False, "ok", 2), ("responses", True, "ok", 2)]


def test_the_processor_serves_responses_with_the_store_it_is_given(bundled_spec, models):
    from app.config.app_args import Limits
    from app.openai_responses.schemas import InputTokensRequest, ResponsesRequest
    from app.serving.processing import OPERATIONS, Processor

    store = MemoryResponseStore()
    processor = Processor([bundled_spec], models, Limits(), response_store=store)
    assert processor.answers[ResponsesRequest].respond.__self__.store is store
    assert isinstance(processor.answers[InputTokensRequest].respond.__self__, InputTokensService)
    assert OPERATIONS[processor.answers[ResponsesRequest].protocol] == "chat"
