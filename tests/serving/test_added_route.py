"""Adding a route is three things in one place: a request type, its service registered with the processing, one
line of the route table. This test adds `/v1/echo` that way, and nothing else: the forwarding code (the
ChatProcessor deployment's methods, the Ingress's RemoteProcessing client, the HTTP handlers) is the real one,
unchanged, in both topologies:

- `single`: the real Processor in the Ingress's process, under the real HTTP app;
- `graph`: the same, behind the real `RemoteProcessing` and the real `ChatProcessor` methods, with the Ray handle
  between them stood in for by direct calls whose arguments and answers are pickled as Ray pickles them. What
  this does not run is Ray's transport itself, which carries any picklable request (tests/graph cover it)."""

from __future__ import annotations

import asyncio
import inspect
import pickle
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from starlette.testclient import TestClient

from app.api.errors import APIError
from app.api.schemas import TokenizeRequest
from app.config.app_args import Limits
from app.generation.caller import ANONYMOUS, Caller
from app.http.openapi import Doc
from app.http.routes import ROUTES, Handler, Route, RouteTable, Trace
from app.http.app import build_http_app
from app.http.model_cards import ModelCard
from app.openai_responses.store import MemoryResponseStore
from app.serving.processing import Answer, Processor
from deployments.chat_processor import ChatProcessor, RemoteProcessing


# ---- the new route, in one place ------------------------------------------------------------------------

class EchoRequest(BaseModel):
    """The schema."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str
    text: str
    stream: bool = False


class EchoService:
    """The service: the text back, whole or word by word."""

    async def complete(self, request: EchoRequest, caller: Caller) -> dict[str, Any]:
        return {"object": "echo", "model": request.model, "text": request.text}

    async def stream(self, request: EchoRequest, caller: Caller):
        yield []  # accepted: the HTTP layer may send its headers
        for word in request.text.split():
            yield [{"object": "echo.chunk", "text": word}]


ECHO = Route("/v1/echo", "POST", Handler.GENERATE, EchoRequest, trace=Trace.INGRESS,
             doc=Doc("echo", "The text back, or an SSE stream of its words when `stream`", "EchoRequest", stream=True))
TABLE = RouteTable((*ROUTES, ECHO))


def register(processor: Processor) -> None:
    service = EchoService()
    processor.register(EchoRequest, Answer(service.complete, service.stream))


# ---- the two topologies, wired as the deployments wire them ---------------------------------------------

class NoModels:
    """Nothing here reaches a model: any call to one fails the test."""

    def __getattr__(self, name: str):
        def fail(*_a, **_k):
            raise AssertionError(f"no model call expected ({name})")
        return fail


class InProcessHandle:
    """A DeploymentHandle to one replica in this process: each call's arguments and its answer (each streamed
    batch) go through pickle, as over Ray."""

    def __init__(self, replica: Any) -> None:
        self.replica = replica
        self.calls: list[str] = []

    def options(self, **_options: Any) -> InProcessHandle:
        return self

    def __getattr__(self, method: str) -> Any:
        handle = self

        class Method:
            @staticmethod
            def remote(*args: Any) -> Any:
                handle.calls.append(method)
                result = getattr(handle.replica, method)(*pickle.loads(pickle.dumps(args)))
                return Streamed(result) if inspect.isasyncgen(result) else answered(result)
        return Method


async def answered(work: Any) -> Any:
    return pickle.loads(pickle.dumps(await work))


class Streamed:
    def __init__(self, events: Any) -> None:
        self.events = events

    async def __aiter__(self):
        async for batch in self.events:
            yield pickle.loads(pickle.dumps(batch))

    def cancel(self) -> None:
        pass


class Wired:
    def __init__(self, topology: str) -> None:
        self.processor = Processor([], NoModels(), Limits(), response_store=MemoryResponseStore())
        register(self.processor)
        self.admitted: list[str] = []
        self.handle: InProcessHandle | None = None
        processing: Any = self.processor
        if topology == "graph":
            replica = object.__new__(ChatProcessor.func_or_class)  # the deployment's own methods over this Processor
            replica.processor = self.processor
            self.handle = InProcessHandle(replica)
            processing = RemoteProcessing(self.handle, self.admitted.append)
        self.client = TestClient(build_http_app(processing, [ModelCard("m")], routes=TABLE))


@pytest.fixture(params=["single", "graph"])
def wired(request) -> Wired:
    return Wired(request.param)


def test_the_added_route_answers_whole_and_streamed(wired):
    with wired.client as client:
        whole = client.post("/v1/echo", json={"model": "m", "text": "hello there"})
        streamed = client.post("/v1/echo", json={"model": "m", "text": "hello there", "stream": True})
    assert whole.status_code == 200 and whole.json() == {"object": "echo", "model": "m", "text": "hello there"}
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.text == ('data: {"object":"echo.chunk","text":"hello"}\n\n'
                             'data: {"object":"echo.chunk","text":"there"}\n\ndata: [DONE]\n\n')
    if wired.handle is not None:  # the Ray hop carried both verbs; the model was admitted before each
        assert wired.handle.calls == ["respond", "stream"] and wired.admitted == ["m", "m"]


def test_the_added_route_gets_the_edges_checks_and_errors(wired):
    with wired.client as client:
        unknown = client.post("/v1/echo", json={"model": "nope", "text": "x"})
        invalid = client.post("/v1/echo", json={"model": "m", "text": 3})
        wrong_method = client.get("/v1/echo")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert invalid.status_code == 400 and invalid.json()["error"]["param"] == "text"
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
    if wired.handle is not None:
        assert wired.handle.calls == []  # refused at the edge: nothing crossed


def test_the_added_route_is_in_the_openapi_document(wired):
    with wired.client as client:
        spec = client.get("/openapi.json").json()
    assert spec["paths"]["/v1/echo"]["post"]["operationId"] == "echo"
    assert spec["components"]["schemas"]["EchoRequest"]["required"] == ["model", "text"]
    assert spec["paths"]["/v1/chat/completions"]["post"]["operationId"] == "createChatCompletion"  # the rest stays


def test_requests_without_a_model_cross_without_admission(wired):
    with wired.client as client:
        gone = client.get("/v1/responses/resp_unknown")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    if wired.handle is not None:
        assert wired.handle.calls == ["respond"] and wired.admitted == []


# ---- the Processor's two verbs ----------------------------------------------------------------------------

def test_a_request_that_cannot_stream_is_refused_if_streamed():
    processor = Processor([], NoModels(), Limits())
    with pytest.raises(APIError) as refused:
        processor.stream(TokenizeRequest(model="m", prompt="x"), ANONYMOUS)
    assert refused.value.status == 400 and refused.value.param == "stream"
    assert "TokenizeRequest cannot be streamed" in refused.value.message


def test_an_unregistered_request_type_says_so():
    processor = Processor([], NoModels(), Limits())
    with pytest.raises(TypeError, match="No service is registered for EchoRequest"):
        asyncio.run(processor.respond(EchoRequest(model="m", text="x"), ANONYMOUS))
