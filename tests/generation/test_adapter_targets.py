"""A request's model and LoRA adapters (app/generation/adapters.py), and the lifecycle handing them to the
generation and the record (app/generation/lifecycle.py), over a fake model: `<base>:<adapter>` and the
`lora` list, what each refuses, and the `adapter` of each request's record."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from app.api.errors import APIError
from app.api.schemas import CompletionRequest, parse_chat_request, parse_request
from app.config.spec import AdapterSpec
from app.engine.events import Finished, Started, Text
from app.generation.adapters import served_target, split_model
from tests.generation.test_lifecycle import SERVICES, SPEC, Records

BASE = dataclasses.replace(SPEC, adapters=(AdapterSpec("a1", "/x/a1.gguf", 1.0), AdapterSpec("a2", "/x/a2.gguf", 0.5)))
COLON = dataclasses.replace(SPEC, id="org:m", adapters=(AdapterSpec("x", "/x/x.gguf"),))
MODELS = {BASE.id: BASE, COLON.id: COLON}


def chat(model: str, **fields):
    return parse_chat_request({"model": model, "messages": [{"role": "user", "content": "hi"}], **fields})


def target(model: str, **fields):
    req = chat(model, **fields)
    return served_target(MODELS, req.model, "chat", "/v1/chat/completions", req.lora)


def refused(status: int, param: str, model: str, **fields) -> APIError:
    with pytest.raises(APIError) as info:
        target(model, **fields)
    assert (info.value.status, info.value.param) == (status, param), info.value
    return info.value


def test_a_colon_names_an_adapter_of_the_model_before_it():
    assert split_model(MODELS, "m") == (BASE, None)
    assert split_model(MODELS, "m:a2") == (BASE, "a2")
    assert split_model(MODELS, "org:m") == (COLON, None)  # an id with a colon is still the model
    assert split_model(MODELS, "org:m:x") == (COLON, "x")
    assert split_model(MODELS, "m:x") is None and split_model(MODELS, "nope:a1") is None


def test_adapters_and_their_scales():
    assert target("m").adapters == () and target("m").label == ""
    assert target("m:a2").adapters == (("a2", 0.5),)  # its configured scale
    assert target("m:a2").label == "a2"
    assert target("m:a1", lora=[{"name": "a1", "scale": 0}]).adapters == (("a1", 0.0),)
    assert target("m:a1", lora=[{"name": "a1", "scale": 0}]).label == ""  # scale 0 is the base model
    # llama-server's form: by index; the list adds adapters, in the model's order, at its scales or theirs
    assert target("m", lora=[{"id": 1, "scale": 2}, {"id": 0, "scale": -1}]).adapters == (("a1", -1.0), ("a2", 2.0))
    assert target("m:a1", lora=[{"name": "a2"}]).adapters == (("a1", 1.0), ("a2", 0.5))
    assert target("m", lora=[{"id": 0, "name": "a1", "scale": 0.25}]).adapters == (("a1", 0.25),)


def test_an_unknown_adapter_is_model_not_found():
    assert refused(404, "model", "m:nope").code == "model_not_found"
    assert refused(404, "lora[0].name", "m", lora=[{"name": "nope"}]).code == "model_not_found"
    assert refused(404, "lora[1].id", "m", lora=[{"id": 0}, {"id": 2}]).code == "model_not_found"


def test_what_a_lora_list_may_not_say():
    refused(400, "lora[1]", "m", lora=[{"name": "a1"}, {"id": 0}])  # one adapter twice
    refused(400, "lora[0]", "m", lora=[{"id": 1, "name": "a1"}])  # two adapters in one entry
    for entry, param in (({"scale": 1}, "lora[0]"), ({"name": "a1", "scale": 10.5}, "lora[0].scale"),
                         ({"name": "a1", "scale": -11}, "lora[0].scale"), ({"name": "a1", "scale": "1"}, "lora[0].scale"),
                         ({"id": -1}, "lora[0].id"), ({"id": True}, "lora[0].id")):
        with pytest.raises(APIError) as info:
            chat("m", lora=[entry])
        assert (info.value.status, info.value.param) == (400, param), (entry, info.value)
    with pytest.raises(APIError) as info:
        chat("m", lora=[{"id": 0}] * 17)
    assert info.value.param == "lora"


class Model:
    """Answers every generation with one word, keeping each GenerationRequest it was given."""

    def __init__(self) -> None:
        self.gens = []

    async def open_stream(self, model_id: str, gen):
        assert model_id == BASE.id  # the base model's replicas serve its adapters
        self.gens.append(gen)
        yield [Started(3, 0)]
        yield [Text("hi", 1)]
        yield [Finished("stop", 3, 1, 0)]


@pytest.mark.parametrize("protocol", sorted(SERVICES))
@pytest.mark.parametrize("stream", [False, True])
def test_the_generation_and_the_record_carry_the_adapters(protocol, stream):
    model, records = Model(), Records()
    service = SERVICES[protocol]([BASE], model.open_stream, observer=records)
    fields = {"model": "m:a1", "stream": stream, "lora": [{"name": "a2", "scale": 0.75}]}
    req = (chat(**fields) if protocol == "chat" else
           parse_request(CompletionRequest, {**fields, "prompt": ["one", "two"]}))

    async def run():
        if not stream:
            return await service.complete(req)
        return [c async for batch in service.stream(req) for c in batch]

    out = asyncio.run(run())
    assert model.gens and all(g.adapters == (("a1", 1.0), ("a2", 0.75)) for g in model.gens)
    [rec] = records.records
    assert (rec.model, rec.adapter) == ("m", "a1,a2")
    body = out if isinstance(out, dict) else out[0]
    assert body["model"] == "m:a1"  # the reply names the model as asked for


def test_a_base_request_records_no_adapter():
    model, records = Model(), Records()
    service = SERVICES["chat"]([BASE], model.open_stream, observer=records)
    asyncio.run(service.complete(chat("m")))
    assert model.gens[0].adapters == () and records.records[0].adapter == ""


def test_a_record_with_an_adapter_says_so_on_its_span():
    from app.observe.request_records import RequestRecord
    from app.observe.tracing import record_attributes

    rec = RequestRecord(model="m", stream=False, status="ok", error_code=None, duration_s=1.0, ttft_s=None,
                        itl_s=None, prompt_tokens=1, completion_tokens=1, cached_tokens=0)
    assert "llamaray.adapter" not in record_attributes(rec)
    assert record_attributes(dataclasses.replace(rec, adapter="a1"))["llamaray.adapter"] == "a1"
