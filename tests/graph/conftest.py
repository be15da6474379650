"""The shared test graphs: each conformance test runs once per topology (`shape`: `single` as `make run`
serves it, `graph` as a cluster does), on one cluster per shape started once per session (tests are
ordered by shape in tests/conftest.py). Files that need a cluster of their own start it in a
module-scoped fixture, which stops the shared one first (tests/support/serve_harness.py, POOL)."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.serve_harness import KEY_A, POOL, SHAPES, start_standard


@pytest.fixture(scope="session", params=SHAPES)
def shape(request) -> str:
    return request.param


@pytest.fixture(scope="session", autouse=True)
def _release_pool():
    yield
    POOL.release()


@pytest.fixture
def cluster(shape):
    return POOL.get(shape, lambda: start_standard(shape))


@pytest.fixture
def client(cluster):
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=KEY_A, max_retries=0, timeout=120)


@pytest.fixture
def http(cluster):
    with httpx.Client(base_url=cluster.url, timeout=120, headers=cluster.headers) as c:
        yield c
