"""/api/chat and /api/generate over model events (no engine): the core's real reply reading (parsers, reasoning
split, tool calls) shaped as Ollama's records, each read by the official `ollama` client's own types; a stream's
records add up to the whole reply; the final record carries why it ended and its counts and durations; what each
request asks of the model (template or none, sampling from `options`, grammar from `format`); a request that only
loads its model generates nothing; `keep_alive` pins and unloads only where the key may manage the pools."""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import replace
from typing import Any

import ollama
import pytest

from app.api.errors import APIError
from app.engine.events import Finished, Started, Text
from app.generation.caller import Caller
from app.ollama_api.keep_alive import KeepAlive
from app.ollama_api.options import FOREVER
from app.ollama_api.schemas import parse_chat, parse_generate
from app.ollama_api.service import OllamaService
from app.tenants.policies import KeyPolicy
from tests.support.hostile_images import solid

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
FINAL = {"done", "done_reason", "total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration",
         "eval_count", "eval_duration"}


def pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def model_events(parts: list[str], finish: str = "stop", *, prompt: int = 40, seen: list | None = None):
    """A model's stream: one batch per part (the parsers see every fragment as it comes)."""
    async def generate(model_id, gen):
        if seen is not None:
            seen.append(gen)
        yield [Started(prompt_tokens=prompt, cached_tokens=0, queued_s=0.0)]
        for part in parts:
            yield [Text(part, 1)]
        yield [Finished(finish, prompt, len(parts), 0)]
    return generate


def service(spec, parts: list[str], finish: str = "stop", *, prompt: int = 40, seen: list | None = None,
            pools: Any = None) -> OllamaService:
    return OllamaService([spec], model_events(parts, finish, prompt=prompt, seen=seen), pools=pools)


async def _records(svc, req, caller: Caller) -> list[dict[str, Any]]:
    stream = svc.stream(req, caller)
    assert await anext(stream) == []  # accepted
    return [record async for batch in stream for record in batch]


def run_both(svc, parse, body: dict[str, Any], caller: Caller = Caller()) -> tuple[dict, list[dict]]:
    whole = asyncio.run(svc.complete(parse({**body, "stream": False}), caller))
    streamed = asyncio.run(_records(svc, parse({**body, "stream": True}), caller))
    return whole, streamed


def chat_body(spec, **fields) -> dict[str, Any]:
    return {"model": f"{spec.id}:latest", "messages": [{"role": "user", "content": "Weather in Paris?"}], **fields}


def check_chat(whole: dict, streamed: list[dict]) -> None:
    """Every record one the client reads; the stream's last the final one; the stream adds up to the whole."""
    for record in [whole, *streamed]:
        ollama.ChatResponse(**record)
    assert all(not r["done"] for r in streamed[:-1]) and streamed[-1]["done"] and FINAL <= set(streamed[-1])
    assert FINAL <= set(whole) and whole["done"]
    assert all(isinstance(whole[k], int) and whole[k] >= 0 for k in FINAL - {"done", "done_reason"})
    assert "".join(r["message"]["content"] for r in streamed) == whole["message"]["content"]
    assert "".join(r["message"].get("thinking", "") for r in streamed) == whole["message"].get("thinking", "")
    calls = [c["function"] for r in streamed for c in r["message"].get("tool_calls", [])]
    assert calls == [c["function"] for c in whole["message"].get("tool_calls", [])]  # ids are each reply's own
    for key in ("done_reason", "prompt_eval_count", "eval_count"):
        assert streamed[-1][key] == whole[key]


@pytest.mark.parametrize("size", [1, 4, 100])
def test_a_chat_reply_whole_and_streamed(bundled_spec, size):
    text = "It is sunny in Paris."
    whole, streamed = run_both(service(bundled_spec, pieces(text, size), prompt=33), parse_chat, chat_body(bundled_spec))
    check_chat(whole, streamed)
    assert whole["message"] == {"role": "assistant", "content": text}
    assert whole["model"] == f"{bundled_spec.id}:latest"  # the name the client sent, resolved to the id
    assert (whole["done_reason"], whole["prompt_eval_count"], whole["eval_count"]) == ("stop", 33, len(pieces(text, size)))
    assert len(streamed) == len(pieces(text, size)) + 1


@pytest.mark.parametrize("size", [1, 7, 300])
def test_tool_calls_go_out_whole_with_arguments_as_objects(bundled_spec, size):
    svc = service(bundled_spec, pieces("Let me check. " + CALL + "\n" + CALL.replace("Paris", "Lyon"), size))
    whole, streamed = run_both(svc, parse_chat, chat_body(bundled_spec, tools=[WEATHER]))
    check_chat(whole, streamed)
    calls = whole["message"]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == [{"city": "Paris"}, {"city": "Lyon"}]
    assert [c["function"]["index"] for c in calls] == [0, 1] and all(c["id"].startswith("call_") for c in calls)
    assert whole["done_reason"] == "stop"
    assert ollama.ChatResponse(**whole).message.tool_calls[1].function.arguments == {"city": "Lyon"}


@pytest.mark.parametrize("size", [1, 5, 100])
def test_thinking_is_its_own_field_and_think_false_drops_it(bundled_spec, size):
    spec = replace(bundled_spec, reasoning_parser="think")
    text = "<think>the sun is up</think>It is sunny."
    whole, streamed = run_both(service(spec, pieces(text, size)), parse_chat, chat_body(spec))
    check_chat(whole, streamed)
    assert whole["message"]["thinking"] == "the sun is up" and whole["message"]["content"] == "It is sunny."
    whole, streamed = run_both(service(spec, pieces(text, size)), parse_chat, chat_body(spec, think=False))
    check_chat(whole, streamed)
    assert "thinking" not in whole["message"] and whole["message"]["content"] == "It is sunny."


def test_a_generation_is_one_user_turn_through_the_template(bundled_spec):
    seen: list = []
    svc = service(bundled_spec, ["Hello", " there"], "length", seen=seen)
    body = {"model": bundled_spec.id, "prompt": "Say hi", "system": "Be brief.",
            "options": {"num_predict": 2, "temperature": 0, "repeat_last_n": -1, "stop": ["\n\n"]}}
    whole, streamed = run_both(svc, parse_generate, body)
    for record in [whole, *streamed]:
        ollama.GenerateResponse(**record)
    assert whole["response"] == "Hello there" == "".join(r["response"] for r in streamed)
    assert whole["done_reason"] == streamed[-1]["done_reason"] == "length" and FINAL <= set(whole)
    gen = seen[0]
    assert "Be brief." in gen.prompt and "Say hi" in gen.prompt and gen.prompt != "Say hi"  # templated
    assert (gen.max_tokens, gen.sampling.temperature, gen.stop) == (2, 0, ["\n\n"])
    assert gen.sampling.penalty_last_n == bundled_spec.n_ctx


def test_raw_takes_the_prompt_as_it_is_and_format_becomes_a_grammar(bundled_spec):
    seen: list = []
    svc = service(bundled_spec, ['{"a"', ': 1}'], seen=seen)
    body = {"model": bundled_spec.id, "prompt": "<|im_start|>user\nJSON please", "raw": True, "format": "json"}
    whole, streamed = run_both(svc, parse_generate, body)
    for record in [whole, *streamed]:
        ollama.GenerateResponse(**record)
    assert whole["response"] == '{"a": 1}' == "".join(r["response"] for r in streamed)
    assert seen[0].prompt == body["prompt"] and seen[0].sampling.grammar
    assert seen[0].max_tokens == bundled_spec.default_max_tokens  # no 16-token cut (OpenAI's legacy default)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    asyncio.run(svc.complete(parse_generate({"model": bundled_spec.id, "prompt": "x", "format": schema,
                                             "stream": False}), Caller()))
    assert seen[-1].sampling.grammar and seen[-1].sampling.grammar != seen[0].sampling.grammar


def test_requests_that_only_load_generate_nothing(bundled_spec):
    seen: list = []
    svc = service(bundled_spec, ["x"], seen=seen)
    body = asyncio.run(svc.complete(parse_chat({"model": bundled_spec.id, "messages": [], "stream": False}), Caller()))
    assert body["done"] and body["done_reason"] == "load" and body["message"]["content"] == ""
    records = asyncio.run(_records(svc, parse_generate({"model": bundled_spec.id, "keep_alive": 0}), Caller()))
    assert [r["done_reason"] for r in records] == ["load"]  # a deployment of its own: always loaded
    assert seen == []


@pytest.mark.parametrize("parse,body,param", [
    (parse_chat, {"messages": [{"role": "user", "content": "x"}], "options": {"tempurature": 1}}, "options.tempurature"),
    (parse_chat, {"messages": [{"role": "user", "content": "x"}], "options": {"num_ctx": 99999}}, "options.num_ctx"),
    (parse_chat, {"messages": [{"role": "user", "content": "x"}], "keep_alive": "later"}, "keep_alive"),
    (parse_chat, {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "messages[0].images[0]"),
    (parse_generate, {"prompt": "x", "system": "s", "images": ["aGk="]}, "images[0]"),
    (parse_chat, {"messages": [], "options": {"x": 1}}, "options.x"),
    (parse_generate, {"prompt": "x", "options": {"num_predict": 10**6}}, "options.num_predict"),
    (parse_generate, {"prompt": "x", "format": {"type": "object", "minLength": 10**6}}, "response_format.json_schema.schema"),
])
def test_refusals_come_before_the_model(bundled_spec, parse, body, param):
    seen: list = []
    svc = service(bundled_spec, ["x"], seen=seen)
    for stream in (False, True):
        req = parse({"model": bundled_spec.id, "stream": stream, **body})
        with pytest.raises(APIError) as info:
            if stream:
                asyncio.run(_records(svc, req, Caller()))
            else:
                asyncio.run(svc.complete(req, Caller()))
        assert info.value.status == 400 and info.value.param == param, info.value
    assert seen == []


def test_another_keys_model_is_not_found(bundled_spec):
    other = Caller(key_id="k", policy=KeyPolicy(name="narrow", key_sha256="0" * 64, models=("elsewhere",)))
    with pytest.raises(APIError) as info:
        asyncio.run(service(bundled_spec, ["x"]).complete(parse_chat(chat_body(bundled_spec, stream=False)), other))
    assert info.value.status == 404 and "not found" in info.value.message


class FakePools:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    async def load(self, request, caller):
        self.calls.append(("load", request.model, None))

    async def unload(self, request, caller):
        self.calls.append(("unload", request.model, None))

    async def pin(self, request, caller):
        self.calls.append(("pin", request.model, request.pinned))


ADMIN = Caller(key_id="a", policy=KeyPolicy(name="ops", key_sha256="1" * 64, admin=True))
USER = Caller(key_id="u", policy=KeyPolicy(name="team", key_sha256="2" * 64))


@pytest.mark.parametrize("caller,seconds,before,after,only", [
    (ADMIN, FOREVER, [("pin", "m", True)], [], ("pin", "load")),
    (ADMIN, 0.0, [], [("unload", "m", None)], ("unload", "unload")),
    (ADMIN, 300.0, [], [], ("load", "load")),
    (Caller(), 0.0, [], [("unload", "m", None)], ("unload", "unload")),  # a server without keys: its local user
    (USER, FOREVER, [], [], ("load", "load")),  # another key neither pins nor unloads what others share
    (USER, 0.0, [], [], ("load", "load")),
    (USER, None, [], [], ("load", "load")),
])
def test_keep_alive_on_a_pooled_model(bundled_spec, caller, seconds, before, after, only):
    pooled = replace(bundled_spec, id="m", pool="tail")
    pools = FakePools()
    keep_alive = KeepAlive(pools)
    asyncio.run(keep_alive.before(pooled, seconds, caller))
    assert pools.calls == before
    pools.calls.clear()
    asyncio.run(keep_alive.after(pooled, seconds, caller))
    assert pools.calls == after
    pools.calls.clear()
    assert asyncio.run(keep_alive.load_only(pooled, seconds, caller)) == only[1]
    assert [c[0] for c in pools.calls] == [only[0]]
    pools.calls.clear()
    for call in (keep_alive.before(bundled_spec, seconds, caller), keep_alive.after(bundled_spec, seconds, caller)):
        asyncio.run(call)  # a model with a deployment of its own: always loaded
    assert asyncio.run(keep_alive.load_only(bundled_spec, seconds, caller)) == "load" and pools.calls == []


def test_an_unload_after_the_reply_that_the_pool_refuses_leaves_the_reply_answered(bundled_spec):
    class BusyPools(FakePools):
        async def unload(self, request, caller):
            raise APIError("busy", status=409, code="model_busy")
    pooled = replace(bundled_spec, pool="tail")
    svc = service(pooled, ["ok"], pools=BusyPools())
    body = asyncio.run(svc.complete(parse_chat(chat_body(pooled, stream=False, keep_alive=0)), ADMIN))
    assert body["message"]["content"] == "ok"


def test_records_are_strict_json(bundled_spec):
    whole, streamed = run_both(service(bundled_spec, ["a"]), parse_chat, chat_body(bundled_spec))
    for record in [whole, *streamed]:
        json.loads(json.dumps(record, allow_nan=False))


@pytest.mark.parametrize("body", [{"prompt": "", "keep_alive": -1}, {"prompt": "", "keep_alive": 0},
                                  {"prompt": "hi", "keep_alive": -1}])
def test_keep_alive_loads_pins_or_unloads_no_model_the_key_may_not_use(bundled_spec, body):
    pooled = replace(bundled_spec, pool="tail")
    pools = FakePools()
    svc = service(pooled, ["x"], pools=pools)
    # An admin key limited to another model: it manages the pools, but only for the models it may use.
    narrow_admin = Caller(key_id="n", policy=KeyPolicy(name="ops-b", key_sha256="3" * 64, admin=True, models=("b",)))
    for caller in (narrow_admin, Caller(key_id="u", policy=KeyPolicy(name="t", key_sha256="4" * 64, models=("b",)))):
        with pytest.raises(APIError) as info:
            asyncio.run(svc.complete(parse_generate({"model": pooled.id, "stream": False, **body}), caller))
        assert info.value.status == 404
    assert pools.calls == []
    asyncio.run(svc.complete(parse_generate({"model": pooled.id, "stream": False, **body}), ADMIN))
    assert pools.calls  # the same request from a key that may use the model does act


PNG = base64.b64encode(solid((0, 0, 255))).decode()


def test_an_image_that_does_not_decode_is_named_as_the_client_sent_it(bundled_spec):
    seen: list = []
    sighted = replace(bundled_spec, mmproj_path="projector.gguf")  # takes images; none is ever decoded here
    svc = service(sighted, ["x"], seen=seen)
    for parse, body, param in (
            (parse_chat, {"messages": [{"role": "user", "content": "x"},
                                       {"role": "user", "content": "y", "images": [PNG, "not base64!"]}]},
             "messages[1].images[1]"),
            (parse_generate, {"prompt": "x", "images": ["iVBORw0KGgo="]}, "images[0]")):
        with pytest.raises(APIError) as info:
            asyncio.run(svc.complete(parse({"model": sighted.id, "stream": False, **body}), Caller()))
        assert info.value.status == 400 and info.value.param == param and param in info.value.message, info.value
    assert seen == []


def test_a_request_refused_at_once_pins_nothing(bundled_spec):
    pooled = replace(bundled_spec, pool="tail")
    embedder = replace(bundled_spec, id="emb", kind="embedding", pool="tail")
    pools = FakePools()
    svc = OllamaService([pooled, embedder], model_events(["x"]), pools=pools)
    for body in ({"model": pooled.id, "options": {"mirostat": 1}}, {"model": "emb"}):
        with pytest.raises(APIError) as info:
            asyncio.run(svc.complete(parse_chat({**chat_body(pooled), **body, "stream": False, "keep_alive": -1}),
                                     ADMIN))
        assert info.value.status == 400
    assert pools.calls == []
