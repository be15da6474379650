"""Ollama's `options`, `keep_alive` and model names, read without a model: each option mapped to the sampling field
it means, and every hostile map refused naming the key (unknown keys, which Ollama ignores; wrong types; values out
of range; samplers this server does not run; a context past the model's); durations as Go writes them; the one
name rule (an exact id, else `name:latest` as `name`, else nothing), and /api/tags' names round-tripping through it."""

from __future__ import annotations

import math
import pickle

import pytest

from app.api.errors import APIError
from app.ollama_api.names import listed_name, resolve_name, resolve_request
from app.ollama_api.options import (
    FOREVER, OPTIONS, check_num_ctx, keep_alive_seconds, penalty_window, read_options,
)
from app.ollama_api.schemas import OllamaChatRequest, parse_chat, parse_generate
from tests.embeddings.test_embedding_service import spec as make_spec


def test_sampling_options_map_to_the_fields_they_mean():
    sampling = read_options({"temperature": 0.2, "top_k": 5, "top_p": 0.9, "min_p": 0.1, "seed": 7,
                             "num_predict": 12, "stop": ["\n"], "repeat_penalty": 1.1, "repeat_last_n": 32,
                             "presence_penalty": 0.5, "frequency_penalty": -0.5, "num_ctx": 256})
    assert sampling.fields == {"temperature": 0.2, "top_k": 5, "top_p": 0.9, "min_p": 0.1, "seed": 7,
                               "max_tokens": 12, "stop": ["\n"], "repeat_penalty": 1.1, "penalty_last_n": 32,
                               "presence_penalty": 0.5, "frequency_penalty": -0.5}
    assert "penalty_last_n" not in sampling.request_fields() and sampling.num_ctx == 256


def test_no_limit_and_random_seed_and_loading_options_set_nothing():
    quiet = {"num_predict": -1, "seed": -1, "num_gpu": 99, "num_thread": 8, "use_mmap": False, "numa": True,
             "num_keep": 4, "penalize_newline": True, "mirostat": 0, "typical_p": 1.0, "tfs_z": 1, "temperature": None}
    assert read_options(quiet).fields == {}
    assert read_options({"num_predict": -2}).fields == {}
    assert read_options(None).fields == {}


@pytest.mark.parametrize("options,param,says", [
    ({"temprature": 0.5}, "options.temprature", "unknown option"),
    ({"x" * 500: 1}, "options." + "x" * 64 + "...", "unknown option"),
    ({"temperature": "0.5"}, "options.temperature", "must be a number"),
    ({"top_k": 4.0}, "options.top_k", "must be an integer"),
    ({"top_k": True}, "options.top_k", "must be an integer"),
    ({"stop": "\n"}, "options.stop", "array of strings"),
    ({"stop": ["a", 3]}, "options.stop", "array of strings"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "options.stop", "at most 4"),
    ({"stop": [""]}, "options.stop", "must not be empty"),
    ({"use_mmap": 1}, "options.use_mmap", "boolean"),
    ({"temperature": 3}, "options.temperature", "out of range"),
    ({"temperature": -0.1}, "options.temperature", "out of range"),
    ({"top_p": 1.5}, "options.top_p", "out of range"),
    ({"repeat_penalty": 0}, "options.repeat_penalty", "above 0"),
    ({"num_predict": 0}, "options.num_predict", "at least 1"),
    ({"num_predict": -3}, "options.num_predict", "out of range"),
    ({"seed": 2**70}, "options.seed", "out of range"),
    ({"temperature": 1e308 * 10}, "options.temperature", "finite"),
    ({"mirostat": 2}, "options.mirostat", "mirostat"),
    ({"typical_p": 0.5}, "options.typical_p", "typical"),
    ({"tfs_z": 0.9}, "options.tfs_z", "tail-free"),
])
def test_hostile_options_are_400s_naming_the_key(options, param, says):
    with pytest.raises(APIError) as info:
        read_options(options)
    assert info.value.status == 400 and info.value.param == param, info.value
    assert says in info.value.message, info.value.message
    assert len(info.value.message) < 1200  # a huge key is not echoed whole


def test_num_ctx_past_the_models_context_is_refused_and_within_it_accepted():
    model = make_spec("chat", "m")  # n_ctx 512
    check_num_ctx(read_options({"num_ctx": 512}), model)
    with pytest.raises(APIError) as info:
        check_num_ctx(read_options({"num_ctx": 8192}), model)
    assert info.value.param == "options.num_ctx" and "512" in info.value.message
    assert penalty_window(read_options({"repeat_last_n": -1}), model) == 512
    assert penalty_window(read_options({}), model) is None


def test_every_option_the_official_client_knows_is_known_here():
    from ollama import Options
    assert set(Options.model_fields) <= set(OPTIONS)


@pytest.mark.parametrize("value,seconds", [
    (None, None), (0, 0.0), ("0", 0.0), (300, 300.0), (1.5, 1.5), ("5m", 300.0), ("1h30m", 5400.0),
    ("300ms", 0.3), ("2h45m10.5s", 9910.5), ("90", 90.0), (-1, FOREVER), ("-1m", FOREVER), ("-1", FOREVER),
    ("1.5h", 5400.0),
])
def test_keep_alive_reads_seconds_and_go_durations(value, seconds):
    got = keep_alive_seconds(value)
    assert got == seconds or (seconds is not None and math.isclose(got, seconds))


@pytest.mark.parametrize("value", ["soon", "5 minutes", "5x", "", "m", True, [5], {"s": 1}, "1" * 100, "1e999"])
def test_keep_alive_that_is_no_duration_is_a_400(value):
    with pytest.raises(APIError) as info:
        keep_alive_seconds(value)
    assert info.value.status == 400 and info.value.param == "keep_alive"


CONFIGURED = {"smollm2", "smollm2:a1", "tiny:v2", "x", "x:latest"}


@pytest.mark.parametrize("sent,resolved", [
    ("smollm2", "smollm2"), ("smollm2:latest", "smollm2"), ("smollm2:a1", "smollm2:a1"), ("tiny:v2", "tiny:v2"),
    ("x:latest", "x:latest"), ("x", "x"), ("tiny", None), ("tiny:latest", None), ("smollm2:a2", None),
    ("SMOLLM2", None), ("smollm2:LATEST", None), (":latest", None), ("smollm2:latest:latest", None),
])
def test_the_name_rule(sent, resolved):
    assert resolve_name(sent, CONFIGURED.__contains__) == resolved


def test_listed_names_come_back_to_their_ids():
    ids = sorted(CONFIGURED)
    listed = {model_id: listed_name(model_id, ids) for model_id in ids}
    assert listed == {"smollm2": "smollm2:latest", "smollm2:a1": "smollm2:a1", "tiny:v2": "tiny:v2", "x": "x",
                      "x:latest": "x:latest"}
    assert all(resolve_name(name, CONFIGURED.__contains__) == model_id for model_id, name in listed.items())


def test_a_model_the_key_may_not_use_is_not_found_as_a_missing_one():
    req = parse_chat({"model": "smollm2:latest", "messages": []})
    hidden = resolve_name("smollm2:latest", lambda model_id: False)
    assert hidden is None
    with pytest.raises(APIError) as info:
        resolve_request(req, lambda model_id: False)
    with pytest.raises(APIError) as missing:
        resolve_request(parse_chat({"model": "nothing:latest", "messages": []}), CONFIGURED.__contains__)
    assert info.value.status == missing.value.status == 404
    assert info.value.message.replace("smollm2", "M") == missing.value.message.replace("nothing", "M")


def test_a_resolved_request_echoes_the_clients_name_and_crosses_a_hop_whole():
    req = resolve_request(parse_chat({"model": "smollm2:latest", "messages": [], "stream": False}),
                          CONFIGURED.__contains__)
    assert (req.model, req.name, req.stream) == ("smollm2", "smollm2:latest", False)
    again = pickle.loads(pickle.dumps(req))
    assert isinstance(again, OllamaChatRequest) and (again.model, again.name) == ("smollm2", "smollm2:latest")


@pytest.mark.parametrize("body,param", [
    ({"model": "m", "prompt": "p", "suffix": "s", "system": "x"}, "system"),
    ({"model": "m", "prompt": "p", "suffix": "s", "images": ["aGk="]}, "images"),
    ({"model": "m", "prompt": "p", "template": "{{ .Prompt }}"}, "template"),
    ({"model": "m", "prompt": "p", "context": [1, 2]}, "context"),
    ({"model": "m", "prompt": "p", "width": 64}, "width"),
    ({"model": "m", "prompt": "p", "raw": True, "images": ["aGk="]}, "images"),
    ({"model": "m", "prompt": "p", "raw": True, "system": "s"}, "system"),
    ({"model": "m", "prompt": "p", "logprobs": True}, "logprobs"),
])
def test_what_this_server_cannot_do_is_refused_naming_it(body, param):
    with pytest.raises(APIError) as info:
        parse_generate(body)
    assert info.value.status == 400 and info.value.param == param and info.value.code == "unsupported_parameter"


@pytest.mark.parametrize("body", [
    {"model": "m", "messages": [], "unknown": 1}, {"model": "m", "messages": [{"role": "bot", "content": "x"}]},
    {"model": "m", "messages": [{"role": "user", "content": 3}]}, {"model": "", "messages": []},
    {"model": "m", "messages": [], "stream": "yes"}, {"model": "m", "messages": [], "format": "xml"},
    {"model": "m", "messages": [], "format": ["json"]}, {"model": "m", "messages": [], "options": [1]},
    {"model": "m", "messages": [], "think": "max"}, {"model": "m", "messages": [], "top_logprobs": 99},
    {"model": "m", "messages": [{"role": "user", "content": "x", "images": "aGk="}]}, [1], "x",
])
def test_malformed_bodies_are_400s(body):
    with pytest.raises(APIError) as info:
        parse_chat(body)
    assert info.value.status == 400
