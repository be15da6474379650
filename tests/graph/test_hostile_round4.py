"""Round 4 of the hostile corpus through a real local Ray Serve, both topologies:

- what a key may reach is exactly what its policy names (app/tenants/access.py), on every route and through every
  field that selects weights: the model, its `:adapter` suffix, `lora` entries by name and by index, Anthropic's
  Messages, legacy completions, the tokenizer, and what `/v1/models` lists;
- a refusal is one INFO line, not an ERROR with a traceback: a flood of 1,000 429s leaves neither in any log;
- work a refused request started does not outlive it: a hundred grammars whose rules each refer to the next
  several times (exponential if expanded) are refused at once, another key's plain request is served, and the
  planning replica's threads are back to their idle count within a second;
- an admitted request carries its key's rate-limit headers (OpenAI's, Anthropic's on /v1/messages).
Keys: TENANT_KEYS (tests/support/serve_harness.py)."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.support.serve_harness import KEY_A, KEY_B, MODEL, TENANT_KEYS, THINK_MODEL, sse_json

pytestmark = pytest.mark.timeout(600)

HELLO = [{"role": "user", "content": "Say hello."}]


def key(name: str) -> str:
    return TENANT_KEYS[name][0]


def post(cluster, path: str, api_key: str, body: dict, timeout: float = 120) -> httpx.Response:
    return httpx.post(f"{cluster.url}{path}", json=body, headers={"Authorization": f"Bearer {api_key}"},
                      timeout=timeout)


def not_found(response: httpx.Response) -> dict:
    assert response.status_code == 404, response.text
    return response.json()["error"]


# ---- what a key may reach ---------------------------------------------------------------------------------------

def test_a_key_limited_to_a_model_reaches_that_model_alone(cluster) -> None:
    api_key = key("base-only")
    listed = httpx.get(f"{cluster.url}/v1/models", headers={"Authorization": f"Bearer {api_key}"}, timeout=60)
    assert [m["id"] for m in listed.json()["data"]] == [MODEL]
    chat = {"model": MODEL, "messages": HELLO, "max_tokens": 1}
    assert post(cluster, "/v1/chat/completions", api_key, chat).status_code == 200
    for model in (f"{MODEL}:a1", f"{MODEL}:a2", THINK_MODEL, MODEL.upper(), f"{MODEL}:", MODEL.replace("o", "\u043e")):
        assert not_found(post(cluster, "/v1/chat/completions", api_key, {**chat, "model": model}))[
            "code"] == "model_not_found", model
        assert post(cluster, "/tokenize", api_key, {"model": model, "prompt": "x"}).status_code == 404
        assert httpx.get(f"{cluster.url}/v1/models/{model}", headers={"Authorization": f"Bearer {api_key}"},
                         timeout=60).status_code == 404
    # The `lora` list selects weights as much as the model's name: by name or by index, an adapter of the model is
    # unknown to this key, and the refusal lists none of the model's adapters.
    for entry, param in (({"name": "a1"}, "lora[0].name"), ({"id": 1}, "lora[0].id"),
                         ({"id": 0, "scale": 0}, "lora[0].id")):
        error = not_found(post(cluster, "/v1/chat/completions", api_key, {**chat, "lora": [entry]}))
        assert error["param"] == param and "(its adapters: none)" in error["message"], error
        assert "a2" not in error["message"] and ("a1" not in error["message"] or "name" in entry), error
        completion = {"model": MODEL, "prompt": "Hi", "max_tokens": 1, "lora": [entry]}
        assert not_found(post(cluster, "/v1/completions", api_key, completion))["param"] == param
    messages = anthropic.Anthropic(base_url=cluster.url, api_key=api_key, max_retries=0, timeout=60)
    with pytest.raises(anthropic.NotFoundError) as refused:
        messages.messages.create(model=f"{MODEL}:a1", max_tokens=1, messages=HELLO)
    assert refused.value.body["error"]["type"] == "not_found_error"


def test_a_key_limited_to_an_adapter_reaches_that_adapter_alone(cluster) -> None:
    api_key = key("one-adapter")
    listed = httpx.get(f"{cluster.url}/v1/models", headers={"Authorization": f"Bearer {api_key}"}, timeout=60)
    assert [m["id"] for m in listed.json()["data"]] == [f"{MODEL}:a1"]
    chat = {"model": f"{MODEL}:a1", "messages": HELLO, "max_tokens": 1}
    assert post(cluster, "/v1/chat/completions", api_key, chat).status_code == 200
    assert post(cluster, "/v1/chat/completions", api_key, {**chat, "lora": [{"name": "a1", "scale": 0.5}]}
                ).status_code == 200
    assert not_found(post(cluster, "/v1/chat/completions", api_key, {**chat, "model": MODEL}))["param"] == "model"
    error = not_found(post(cluster, "/v1/chat/completions", api_key, {**chat, "lora": [{"name": "a2"}]}))
    assert error["param"] == "lora[0].name" and error["message"].endswith("(its adapters: 0 `a1`).")
    assert not_found(post(cluster, "/v1/chat/completions", api_key, {**chat, "lora": [{"id": 1}]}))["param"] == \
        "lora[0].id"
    # Its one adapter at scale 0 is the base model's weights, which the key may not use.
    assert not_found(post(cluster, "/v1/chat/completions", api_key, {**chat, "lora": [{"name": "a1", "scale": 0}]}))[
        "param"] == "model"
    completion = {"model": MODEL, "prompt": "Hi", "max_tokens": 1, "lora": [{"name": "a1"}]}
    assert not_found(post(cluster, "/v1/completions", api_key, completion))["param"] == "model"


# ---- refusals in the logs ---------------------------------------------------------------------------------------

def log_files(cluster) -> dict[Path, int]:
    """Every log file of the cluster's Ray session, with its size now."""
    logs = cluster.session_dir / "logs"
    return {p: p.stat().st_size for p in logs.rglob("*") if p.is_file() and p.suffix in (".log", ".out", ".err")}


def written_since(cluster, sizes: dict[Path, int]) -> dict[Path, str]:
    """What each log file got since `sizes` was taken (files created since included)."""
    out = {}
    for path in log_files(cluster):
        with path.open("rb") as f:
            f.seek(sizes.get(path, 0))
            text = f.read().decode("utf-8", "replace")
        if text:
            out[path] = text
    return out


def test_a_flood_of_429s_leaves_no_error_and_no_traceback_in_any_log(cluster) -> None:
    api_key = key("flood")  # one request a minute
    assert post(cluster, "/v1/chat/completions", api_key, {"model": MODEL, "messages": HELLO, "max_tokens": 1}
                ).status_code == 200
    before = log_files(cluster)
    bodies = [({"model": MODEL, "messages": HELLO, "max_tokens": 1}, "/v1/chat/completions"),
              ({"model": MODEL, "messages": HELLO, "max_tokens": 1, "stream": True}, "/v1/chat/completions"),
              ({"model": MODEL, "max_tokens": 1, "messages": HELLO}, "/v1/messages")]

    async def flood() -> list[int]:
        limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
        async with httpx.AsyncClient(base_url=cluster.url, timeout=120, limits=limits,
                                     headers={"Authorization": f"Bearer {api_key}"}) as client:
            gate = asyncio.Semaphore(16)

            async def one(i: int) -> int:
                body, path = bodies[i % len(bodies)]
                async with gate:
                    return (await client.post(path, json=body)).status_code
            return await asyncio.gather(*(one(i) for i in range(1000)))

    statuses = asyncio.run(flood())
    assert statuses == [429] * 1000
    # Serve writes its logs as records come; the refusals' own line comes within its interval.
    deadline, new = time.monotonic() + 30, {}
    while time.monotonic() < deadline:
        new = written_since(cluster, before)
        if any("refused 429" in text for text in new.values()):
            break
        time.sleep(0.5)
    assert any("refused 429 rate_limit_exceeded" in text and "key flood" in text for text in new.values()), \
        sorted(p.name for p in new)
    for path, text in new.items():
        for line in text.splitlines():
            assert "Traceback" not in line and " ERROR " not in line and "ERROR:" not in line, (path.name, line)
    refusal_lines = sum(text.count("refused 429") for text in new.values())
    assert refusal_lines < 50  # one line per key and kind an interval, not one per request


# ---- work that outlives its request -----------------------------------------------------------------------------

def dag_grammar(depth: int = 14, fan: int = 4) -> str:
    """~320 bytes whose rules each refer to the next `fan` times: 4^14 (268 million) terminal parts written out."""
    rules = ["root ::= r0"] + [f"r{i} ::= " + " ".join([f"r{i + 1}"] * fan) for i in range(depth)]
    return "\n".join(rules + [f'r{depth} ::= "ab"'])


def planning_pid(cluster) -> int:
    """The process that plans requests (renders, compiles grammars): the Ingress in `make run`'s shape, the
    ChatProcessor in the graph."""
    name = "Ingress" if cluster.topology == "single" else "ChatProcessor"
    return cluster.handle(name).replica_info.remote().result()["pid"]


def threads_of(pid: int) -> int:
    return int(next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("Threads:")))


def test_a_hundred_exponential_grammars_from_one_key_leave_nothing_running(cluster) -> None:
    plain = {"model": MODEL, "messages": HELLO, "max_tokens": 4, "stream": True}
    bomb = {"model": MODEL, "messages": HELLO, "max_tokens": 4, "grammar": dag_grammar()}
    first = post(cluster, "/v1/chat/completions", KEY_A, {**bomb, "stream": False})  # the pools started
    assert first.status_code == 400 and first.json()["error"]["code"] == "grammar_too_complex", first.text
    assert post(cluster, "/v1/chat/completions", KEY_B, plain).status_code == 200
    pid = planning_pid(cluster)
    idle = threads_of(pid)

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: post(cluster, "/v1/chat/completions", KEY_A, bomb), range(100)))
    last_refusal = time.monotonic()
    assert {(r.status_code, r.json()["error"]["code"]) for r in answers} == {(400, "grammar_too_complex")}
    deadline = last_refusal + 1.0
    while threads_of(pid) > idle and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threads_of(pid) <= idle

    started = time.monotonic()
    with httpx.stream("POST", f"{cluster.url}/v1/chat/completions", json=plain, timeout=120,
                      headers={"Authorization": f"Bearer {KEY_B}"}) as response:
        assert response.status_code == 200
        first_token = None
        for line in response.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                first_token = time.monotonic() - started
                break
    # Well inside its planning deadline (limits.grammar_timeout_s, 5 s): nothing of the hundred holds a thread.
    assert first_token is not None and first_token < 5.0


# ---- rate-limit headers on every answer -------------------------------------------------------------------------

def test_an_admitted_request_carries_its_keys_rate_limits(cluster) -> None:
    api_key = key("paced")
    whole = post(cluster, "/v1/chat/completions", api_key, {"model": MODEL, "messages": HELLO, "max_tokens": 1})
    assert whole.status_code == 200
    assert whole.headers["x-ratelimit-limit-requests"] == "10000"
    assert 0 < int(whole.headers["x-ratelimit-remaining-requests"]) < 10000
    assert whole.headers["x-ratelimit-limit-tokens"] == "10000000" and whole.headers["x-ratelimit-reset-requests"]
    with httpx.stream("POST", f"{cluster.url}/v1/chat/completions", timeout=120,
                      json={"model": MODEL, "messages": HELLO, "max_tokens": 2, "stream": True},
                      headers={"Authorization": f"Bearer {api_key}"}) as streamed:
        assert streamed.status_code == 200 and streamed.headers["x-ratelimit-limit-requests"] == "10000"
        chunks, _ = sse_json(streamed.read().decode())
    assert chunks and all("choices" in c for c in chunks)  # the headers' item never reaches the stream
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=api_key, max_retries=0, timeout=60)
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=HELLO, max_tokens=1)
    assert raw.headers["x-ratelimit-remaining-requests"] and raw.parse().choices
    messages = anthropic.Anthropic(base_url=cluster.url, api_key=api_key, max_retries=0, timeout=60)
    raw = messages.messages.with_raw_response.create(model=MODEL, max_tokens=1, messages=HELLO)
    assert raw.headers["anthropic-ratelimit-requests-limit"] == "10000"
    assert not any(name.startswith("x-ratelimit") for name in raw.headers)
    # A key without limits has nothing to report.
    assert "x-ratelimit-limit-requests" not in post(cluster, "/v1/chat/completions", KEY_A, {
        "model": MODEL, "messages": HELLO, "max_tokens": 1}).headers
