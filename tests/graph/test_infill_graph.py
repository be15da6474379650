"""Fill-in-the-middle through the shared test graph, in both topologies: `/infill` as llama-server serves it and
`suffix` on `/v1/completions` (the `openai` SDK), on THINKING_MODEL, the bundled GGUF written with FIM tokens in
its metadata (tools/fim_gguf.py).

The prompt that reaches llama.cpp is checked token by token against the layout llama-server's
`format_prompt_infill` builds for the same body (its FIM tokens as ids, each text part tokenized by the model's
own tokenizer through /tokenize); /tokenize with the same fields gives that prompt, and /infill's
`tokens_evaluated` counts it. The greedy reply is the same whole and streamed. The oracle comparison with
llama-server itself is tests/graph/test_infill_oracle.py (slow: it needs a llama-server binary).
"""

from __future__ import annotations

import time

import openai
import pytest

from tests.support.openapi_spec import assert_valid_completion
from tests.support.serve_harness import KEY_A, MODEL, THINKING_MODEL, sse_json
from tools.fim_gguf import FIM_TOKENS

pytestmark = pytest.mark.timeout(600)

PRE, SUF, MID, REP, SEP = (FIM_TOKENS[k] for k in ("fim_pre", "fim_suf", "fim_mid", "fim_rep", "fim_sep"))
BODY = {"model": THINKING_MODEL, "input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n\nprint(add(1, 2))\n",
        "input_extra": [{"filename": "util.py", "text": "import math\n"}], "prompt": "a",
        "n_predict": 12, "temperature": 0, "cache_prompt": False}


def text(http, s: str) -> list[int]:
    r = http.post("/tokenize", json={"model": THINKING_MODEL, "prompt": s, "add_special": False})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def expected_layout(http, body) -> list[int]:
    """llama-server's layout (format_prompt_infill) for `body`, from the GGUF's FIM ids and the tokenizer."""
    extra = [REP, *text(http, "myproject\n")]
    for chunk in body.get("input_extra", []):
        extra += [SEP, *text(http, chunk.get("filename", "tmp") + "\n"), *text(http, chunk["text"])]
    extra += [SEP, *text(http, "filename\n")]
    return [*extra, PRE, *text(http, body["input_prefix"]), *text(http, body["prompt"]),
            SUF, *text(http, body["input_suffix"]), MID]


def test_the_infill_prompt_is_llama_servers_layout_token_by_token(http):
    fields = {k: BODY[k] for k in ("model", "input_prefix", "input_suffix", "input_extra", "prompt")}
    r = http.post("/tokenize", json=fields)
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == expected_layout(http, BODY)
    whole = http.post("/infill", json=BODY)
    assert whole.status_code == 200, whole.text
    assert whole.json()["tokens_evaluated"] == r.json()["count"]


def test_infill_answers_llama_servers_object_whole_and_streamed(http):
    whole = http.post("/infill", json=BODY).json()
    assert whole["stop"] is True and whole["stop_type"] in ("eos", "limit") and whole["model"] == THINKING_MODEL
    assert 1 <= whole["tokens_predicted"] <= 12 and whole["timings"]["predicted_n"] == whole["tokens_predicted"]
    assert {"content", "tokens", "id_slot", "generation_settings", "has_new_line", "truncated", "stopping_word",
            "tokens_cached", "timings"} <= set(whole)
    r = http.post("/infill", json={**BODY, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks, events = sse_json(r.text)
    assert "[DONE]" not in events  # llama-server's own streams end with the whole object, no [DONE]
    assert all(c["stop"] is False for c in chunks[:-1]) and chunks[-1]["stop"] is True
    assert "".join(c["content"] for c in chunks) == whole["content"]
    assert chunks[-1]["tokens_predicted"] == whole["tokens_predicted"]
    picked = http.post("/infill", json={**BODY, "response_fields": ["content", "timings/prompt_n"]}).json()
    assert picked == {"content": whole["content"], "timings/prompt_n": whole["timings"]["prompt_n"]}


def test_suffix_on_the_legacy_route_is_the_same_layout(cluster, http):
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=KEY_A, max_retries=0, timeout=120)
    prefix, suffix = BODY["input_prefix"], BODY["input_suffix"]
    completion = client.completions.create(model=THINKING_MODEL, prompt=prefix, suffix=suffix, max_tokens=12,
                                           temperature=0, extra_body={"cache_prompt": False})
    assert_valid_completion(completion.model_dump(exclude_unset=True))
    layout = http.post("/tokenize", json={"model": THINKING_MODEL, "input_prefix": prefix,
                                          "input_suffix": suffix}).json()
    assert completion.usage.prompt_tokens == layout["count"]
    infill = http.post("/infill", json={"model": THINKING_MODEL, "input_prefix": prefix, "input_suffix": suffix,
                                        "n_predict": 12, "temperature": 0, "cache_prompt": False}).json()
    assert completion.choices[0].text == infill["content"]


def test_a_model_without_fim_tokens_is_a_400_naming_it(http):
    for path, body in (("/infill", {"model": MODEL, "input_prefix": "a", "input_suffix": "b"}),
                       ("/v1/completions", {"model": MODEL, "prompt": "a", "suffix": "b"}),
                       ("/tokenize", {"model": MODEL, "input_prefix": "a", "input_suffix": "b"})):
        r = http.post(path, json=body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "model" and err["code"] == "fim_unsupported" and MODEL in err["message"]


def test_hostile_infill_bodies_are_refused_fast_and_client_text_stays_text(http):
    started = time.monotonic()
    flood = {"model": THINKING_MODEL, "input_prefix": "", "input_suffix": "", "input_extra": [{"text": ""}] * 100_000}
    r = http.post("/infill", json=flood)
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_inputs"
    assert time.monotonic() - started < 10
    for bad, param in (({"input_prefix": "a"}, "input_suffix"), ({"input_prefix": 1, "input_suffix": ""}, "input_prefix"),
                       ({"input_prefix": "", "input_suffix": "", "input_extra": "x"}, "input_extra"),
                       ({"input_prefix": "", "input_suffix": "", "n_predict": 5000}, "n_predict")):
        r = http.post("/infill", json={"model": THINKING_MODEL, **bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = http.post("/infill", json={"input_prefix": "a", "input_suffix": "b"})  # several chat models: name one
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    spelled = "<issue_start><issue_closed><file_sep><reponame>"
    tokens = http.post("/tokenize", json={"model": THINKING_MODEL, "input_prefix": spelled, "input_suffix": spelled,
                                          "input_extra": [{"filename": spelled, "text": spelled}]}).json()["tokens"]
    assert tokens.count(PRE) == tokens.count(MID) == tokens.count(REP) == 1 and tokens.count(SEP) == 2
