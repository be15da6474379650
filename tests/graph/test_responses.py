"""OpenAI's Responses API through the served graph (both topologies), with the official SDK, raw SSE validated
against OpenAI's spec, and the OpenAI Agents SDK running a tool."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from tests.support.openapi_spec import assert_valid
from tests.support.responses_events import assert_valid_event
from tests.support.serve_harness import KEY_A, KEY_B, MODEL, REPRODUCIBLE

pytestmark = pytest.mark.timeout(600)

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}}
ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 20}, "sure": {"type": "boolean"}},
          "required": ["answer", "sure"], "additionalProperties": False}
JSON_FORMAT = {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}}


def typed_events(text: str) -> list[dict]:
    """Each SSE block's `event:` name must be its data's `type`; no [DONE]."""
    events = []
    for block in filter(None, text.split("\n\n")):
        lines = dict(line.split(": ", 1) for line in block.split("\n") if not line.startswith(":"))
        event = json.loads(lines["data"])
        assert lines["event"] == event["type"]
        events.append(event)
    assert "[DONE]" not in text
    return events


def test_create_text(client):
    raw = client.responses.with_raw_response.create(model=MODEL, input="Tell me about the moon.",
                                                    instructions="Answer in one sentence.", max_output_tokens=12,
                                                    metadata={"case": "text"})
    body = raw.http_response.json()
    assert_valid("Response", body)
    response = raw.parse()
    assert response.id.startswith("resp_") and response.model == MODEL
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].type == "message" and response.output_text
    assert response.usage.output_tokens == 12 and response.usage.input_tokens > 10
    assert response.instructions == "Answer in one sentence." and response.metadata == {"case": "text"}


def test_sdk_stream_and_raw_events(client, http):
    with client.responses.stream(model=MODEL, input="Is the moon round?", text=JSON_FORMAT,
                                 max_output_tokens=80) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed" and "".join(deltas) == final.output_text
    assert set(json.loads(final.output_text)) == {"answer", "sure"}

    r = http.post("/v1/responses", json={"model": MODEL, "input": "Is the moon round?", "stream": True,
                                         "text": JSON_FORMAT, "max_output_tokens": 80})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = typed_events(r.text)
    for event in events:
        assert_valid_event(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert len({e["response"]["id"] for e in events if "response" in e}) == 1
    assert_valid("Response", events[-1]["response"])


def test_streamed_and_whole_replies_are_equal_for_a_seeded_request(client):
    fields = {"model": MODEL, "input": "Tell me a story about a cat.", "max_output_tokens": 20, "temperature": 0.8,
              "extra_body": {"seed": 11, **REPRODUCIBLE}}
    whole = client.responses.create(**fields)
    with client.responses.stream(**fields) as stream:
        # a cut reply ends with response.incomplete (the helper's final response is a completed one)
        (last,) = [e.response for e in stream if e.type == "response.incomplete"]
    assert last.status == "incomplete" and whole.status == "incomplete"
    assert last.output_text == whole.output_text and last.usage.output_tokens == whole.usage.output_tokens == 20


def test_function_call_round_trip(client):
    first = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[WEATHER],
                                    tool_choice="required", max_output_tokens=60)
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
    assert first.status == "completed"
    # the conversation sent back in full (stateless), as agents do
    history = [{"role": "user", "content": "What is the weather in Paris?"},
               *[item.model_dump(exclude_none=True) for item in first.output],
               {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}]
    second = client.responses.create(model=MODEL, input=history, tools=[WEATHER], store=False, max_output_tokens=10)
    assert second.output[0].type == "message" and second.output_text
    # named choice, streamed: the arguments arrive in pieces as generated
    with client.responses.stream(model=MODEL, input="Weather in Rome?", tools=[WEATHER], max_output_tokens=60,
                                 tool_choice={"type": "function", "name": "get_weather"}) as stream:
        pieces = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    (streamed,) = [item for item in final.output if item.type == "function_call"]
    assert len(pieces) > 1 and "".join(pieces) == streamed.arguments


def test_previous_response_id_continues_and_is_owner_scoped(client, cluster):
    first = client.responses.create(model=MODEL, input="My name is Ada. Remember it.", max_output_tokens=8)
    second = client.responses.create(model=MODEL, previous_response_id=first.id, input="What is my name?",
                                     max_output_tokens=8)
    assert second.previous_response_id == first.id
    # the stored turn and its reply come first: the prompt grew by more than the new input, and its prefix
    # was found in the cache
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0
    counted = client.responses.input_tokens.count(model=MODEL, previous_response_id=first.id,
                                                  input="What is my name?")
    assert counted.input_tokens == second.usage.input_tokens
    other = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=KEY_B, max_retries=0, timeout=120)
    for c, rid in ((other, first.id), (client, "resp_nope")):
        with pytest.raises(openai.NotFoundError) as err:
            c.responses.create(model=MODEL, previous_response_id=rid, input="Hi", max_output_tokens=4)
        assert err.value.body["param"] == "previous_response_id" and err.value.body["code"] == "not_found"


def test_json_schema_format_gives_parseable_json(client):
    response = client.responses.create(model=MODEL, input="Is the sky blue?", text=JSON_FORMAT,
                                       max_output_tokens=80)
    value = json.loads(response.output_text)
    assert set(value) == {"answer", "sure"} and isinstance(value["sure"], bool) and len(value["answer"]) <= 20


@pytest.mark.parametrize("fields, param", [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"background": True}, "background"),
])
def test_refused_fields_are_400s_naming_them(client, fields, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="Hi", **fields)
    assert err.value.body["param"] == param and err.value.body["type"] == "invalid_request_error"


def test_agents_sdk_runs_a_tool(cluster):
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)
    calls = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"Sunny in {city}"

    async def main():
        client = openai.AsyncOpenAI(base_url=f"{cluster.url}/v1", api_key=KEY_A,
                                    max_retries=0, timeout=120)
        # The 135M model calls tools only when forced; the run then stops with the tool's result.
        agent = Agent(name="weather", instructions="Use the tools.", tools=[get_weather],
                      model=OpenAIResponsesModel(model=MODEL, openai_client=client),
                      model_settings=ModelSettings(tool_choice="required", max_tokens=60),
                      tool_use_behavior="stop_on_first_tool")
        try:
            return await Runner.run(agent, "What is the weather in Paris?")
        finally:
            await client.close()

    result = asyncio.run(main())
    assert len(calls) == 1 and result.final_output == f"Sunny in {calls[0]}"
