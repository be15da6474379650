"""The graph as `make run` starts it: Ray Serve with app/ray_env.py's settings (direct ingress, gRPC
handles, a slower controller loop) and `chat_processor: ingress` (no ChatProcessor deployment)."""

from __future__ import annotations

import openai
import pytest
from ray import serve

from app.ray_env import LOCAL_RAY_ENV
from tests.support.openapi_spec import assert_valid
from tests.support.serve_harness import APP, MODEL, ServeCluster, load_config

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def cluster():
    config = load_config("configs/local-cpu.yaml", {"applications": [{
        "name": "llamaray", "args": {"models": [{"id": MODEL, "n_ctx": 1024, "n_seq_max": 2}]}}]})
    with ServeCluster(config, num_cpus=2, env=LOCAL_RAY_ENV) as c:
        yield c


def test_make_run_shape_serves_chat_and_streams(cluster):
    assert set(serve.status().applications[APP].deployments) == {"Ingress", f"LlamaModel-{MODEL}"}
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=0, timeout=120)
    body = dict(model=MODEL, messages=[{"role": "user", "content": "Name a color."}], max_tokens=12, seed=2)
    whole = client.chat.completions.create(**body)
    assert_valid("CreateChatCompletionResponse", whole.model_dump(exclude_unset=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**body, stream=True)
                       if c.choices)
    assert whole.choices[0].message.content and streamed == whole.choices[0].message.content
