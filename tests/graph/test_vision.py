"""Images in chat through both topologies with the official clients, on the standard cluster's chat model and
its colour projector (tools/colour_mmproj.py: a stand-in, not a vision model, that reads a one-colour image
as " a <colour> square."): the answer names the image's colour, for three colours, through chat (whole and
streamed), the Responses API and Anthropic's Messages; usage counts the image's tokens; a model without a
projector gets a 400 naming the part. The hostile images are in test_hostile.py's corpus."""

from __future__ import annotations

import base64
import re

import anthropic
import pytest

from tests.support.hostile_images import data_url, solid
from tests.support.openapi_spec import assert_valid
from tests.support.serve_harness import KEY_A, MODEL, THINK_MODEL
from tools.colour_mmproj import N_PATCHES

COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}
WORDS = {"red", "green", "blue", "yellow", "white", "black", "pink", "purple", "orange"}


def png(colour: str) -> bytes:
    return solid(COLOURS[colour], (64, 48))


def question(colour: str) -> list[dict]:
    return [{"role": "user", "content": [
        {"type": "text", "text": "Here is an image:"},
        {"type": "image_url", "image_url": {"url": data_url(png(colour))}},
        {"type": "text", "text": "What colour is it?"}]}]


def names_only(reply: str, colour: str) -> bool:
    """The reply names the colour, and no other colour."""
    words = set(re.findall(r"[a-z]+", reply.lower()))
    return colour in words and not (words & WORDS) - {colour}


@pytest.mark.parametrize("colour", sorted(COLOURS))
def test_the_answer_depends_on_the_image(client, http, colour):
    body = http.post("/v1/chat/completions", json={"model": MODEL, "messages": question(colour), "max_tokens": 12,
                                                    "temperature": 0}).json()
    assert_valid("CreateChatCompletionResponse", body)
    reply = body["choices"][0]["message"]["content"]
    assert names_only(reply, colour), reply
    text_only = client.chat.completions.create(model=MODEL, max_tokens=1, messages=[
        {"role": "user", "content": [{"type": "text", "text": "Here is an image:"},
                                     {"type": "text", "text": "What colour is it?"}]}])
    # The image's tokens (the projector's patches) count in usage; text-only the parts render the same.
    assert body["usage"]["prompt_tokens"] == text_only.usage.prompt_tokens + N_PATCHES


def test_a_streamed_answer_depends_on_the_image_too(client):
    stream = client.chat.completions.create(model=MODEL, messages=question("blue"), max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    reply = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert names_only(reply, "blue"), reply
    assert chunks[-1].usage.prompt_tokens > N_PATCHES


def test_an_input_image_through_the_responses_api(client):
    response = client.responses.create(model=MODEL, max_output_tokens=12, temperature=0, store=False, input=[
        {"role": "user", "content": [
            {"type": "input_text", "text": "Here is an image:"},
            {"type": "input_image", "image_url": data_url(png("green")), "detail": "auto"},
            {"type": "input_text", "text": "What colour is it?"}]}])
    assert names_only(response.output_text, "green"), response.output_text


def test_an_image_block_through_anthropics_messages(cluster):
    client = anthropic.Anthropic(base_url=cluster.url, api_key=KEY_A, max_retries=0, timeout=120)
    message = client.messages.create(model=MODEL, max_tokens=12, extra_body={"temperature": 0}, messages=[
        {"role": "user", "content": [
            {"type": "text", "text": "Here is an image:"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(png("red")).decode()}},
            {"type": "text", "text": "What colour is it?"}]}])
    reply = "".join(block.text for block in message.content if block.type == "text")
    assert names_only(reply, "red"), reply


def test_the_counting_routes_count_the_image_as_its_generation_does(client, cluster):
    messages = anthropic.Anthropic(base_url=cluster.url, api_key=KEY_A, max_retries=0, timeout=120).messages
    blocks = [{"type": "text", "text": "Here is an image:"},
              {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                           "data": base64.b64encode(png("blue")).decode()}},
              {"type": "text", "text": "What colour is it?"}]
    counted = messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": blocks}]).input_tokens
    made = messages.create(model=MODEL, max_tokens=1, messages=[{"role": "user", "content": blocks}]).usage
    assert counted == made.input_tokens + (made.cache_read_input_tokens or 0)
    parts = [{"type": "input_text", "text": "Here is an image:"},
             {"type": "input_image", "image_url": data_url(png("blue"))}]
    counted = client.responses.input_tokens.count(model=MODEL, input=[{"role": "user", "content": parts}]).input_tokens
    made = client.responses.create(model=MODEL, max_output_tokens=16, store=False,
                                   input=[{"role": "user", "content": parts}]).usage
    assert counted == made.input_tokens


def test_a_model_without_a_projector_names_the_image_part(http):
    messages = question("red")
    r = http.post("/v1/chat/completions", json={"model": THINK_MODEL, "messages": messages, "max_tokens": 4})
    assert r.status_code == 400, r.text
    assert_valid("ErrorResponse", r.json())
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("images_unsupported", "messages[0].content[1]")
