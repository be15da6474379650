"""The Models boundary's second verb: every job type has its handler in EngineHost's one table, each job
reaches its engine call there, and LocalModels forwards any job (bounded, its failures as APIErrors) without
knowing its type. Driven with a stand-in engine (no Ray replica, no model)."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

import pytest

pytest.importorskip("ray")

from app.api.errors import APIError  # noqa: E402
from app.engine import jobs, params  # noqa: E402
from app.engine.jobs import CountPromptJob, DetokenizeJob, StatsJob, TokenizeJob  # noqa: E402
from app.engine.params import EmbeddingJob, ImageInput, Job  # noqa: E402
from deployments.engine_host import JOB_HANDLERS, EngineHost  # noqa: E402
from deployments.models import LocalModels  # noqa: E402


class Engine:
    """Records what it is asked; answers in ways the test can tell apart."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def tokenize(self, text, add_special):
        self.calls.append(("tokenize", text, add_special))
        return [len(text), int(add_special)]

    def detokenize(self, tokens):
        self.calls.append(("detokenize", tokens))
        return "-".join(map(str, tokens))

    def count_prompt(self, prompt, images):
        self.calls.append(("count_prompt", prompt, images))
        return len(prompt) + 100 * len(images)

    def stats(self):
        return {"running": 0, "steps": 7}


def host_with(engine) -> EngineHost:
    host = object.__new__(EngineHost)  # no Ray replica context: set what the handlers read
    host.spec = SimpleNamespace(id="m", n_seq_max=1, kind="chat")
    host.engine, host.unavailable = engine, None
    host._unstarted = 0
    return host


def test_every_job_type_has_a_handler():
    defined = {cls for module in (params, jobs) for cls in vars(module).values()
               if isinstance(cls, type) and issubclass(cls, Job) and cls is not Job}
    assert defined >= {EmbeddingJob, TokenizeJob, DetokenizeJob, CountPromptJob, StatsJob}
    assert defined == set(JOB_HANDLERS)


def test_each_job_reaches_its_engine_call():
    engine = Engine()
    host = host_with(engine)
    image = ImageInput(width=1, height=1, rgb=b"\0\0\0", digest="d")

    async def go():
        return (await host.run(TokenizeJob("abc", add_special=False)), await host.run(DetokenizeJob([1, 2])),
                await host.run(CountPromptJob("abcd", [image])), await host.run(StatsJob()))

    tokens, text, count, stats = asyncio.run(go())
    assert (tokens, text, count) == ([3, 0], "1-2", 104)
    assert stats == {"model": "m", "pid": os.getpid(), "running": 0, "steps": 7}
    assert engine.calls == [("tokenize", "abc", False), ("detokenize", [1, 2]), ("count_prompt", "abcd", [image])]


def test_a_job_the_model_does_not_serve_is_a_400():
    with pytest.raises(APIError) as err:  # the chat engine has no pooling
        asyncio.run(host_with(Engine()).run(EmbeddingJob("e", ("hi",))))
    assert (err.value.status, err.value.code) == (400, "unsupported_model")


def test_local_models_forward_any_job_bounded_and_map_its_failures():
    class Host:
        def __init__(self) -> None:
            self.got: list = []

        async def run(self, job, *, bounded=False):
            self.got.append((job, bounded))
            if isinstance(job, StatsJob):
                raise RuntimeError("a bug")
            return "answered"

    host = Host()
    models = LocalModels({"m": host})
    job = TokenizeJob("hi")
    assert asyncio.run(models.run("m", job)) == "answered"
    assert host.got == [(job, True)]
    with pytest.raises(APIError) as err:  # an unexpected failure is a 500, as over a handle
        asyncio.run(models.run("m", StatsJob()))
    assert err.value.status == 500


def test_a_job_of_no_known_type_is_a_500_over_local_models():
    class Unknown(Job[int]):
        pass

    models = LocalModels({"m": host_with(Engine())})
    with pytest.raises(APIError) as err:
        asyncio.run(models.run("m", Unknown()))
    assert err.value.status == 500
