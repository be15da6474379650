"""Images in the engine: a random tiny projector (tests/support/tiny_mmproj.py) on the bundled model.
The image rows mean nothing to the model; these tests check where they go: their positions counted, decoded
beside text-only requests, never mistaken for another image's cached KV, and every mtmd object freed."""

from __future__ import annotations

import hashlib
import uuid

import pytest

from app.engine import GenerationRequest, SamplingParams
from app.engine.events import Finished, Text
from app.engine.params import IMAGE_MARKER, ImageInput
from app.engine.vision import ImageSpan
from app.prompt.chat_template import render_prompt
from app.prompt.content_marks import OPEN
from tests.support.events import EventBox
from tests.support.tiny_mmproj import IMAGE_TOKENS
from tests.support.waiting import wait_for
from tests.support.engine_errors import client_error

pytestmark = pytest.mark.timeout(300)

QUESTION = "What is in this picture?"


@pytest.fixture
def vision(vision_engine):
    return vision_engine


def image(rgb: tuple[int, int, int], size: int = 64) -> ImageInput:
    data = bytes(rgb) * (size * size)
    return ImageInput(size, size, data, hashlib.sha256(data).hexdigest())


def prompt(spec, text: str = QUESTION, image_first: bool = True) -> str:
    """A rendered chat prompt, with an image place before the user's (marked) text when asked."""
    rendered = render_prompt(spec.chat_template, [{"role": "user", "content": text}], mark_content=True)
    return rendered.replace(OPEN, IMAGE_MARKER + OPEN, 1) if image_first else rendered


def run(eng, text_prompt: str, images=(), max_tokens: int = 4, request_id: str = "", **kw) -> EventBox:
    box = EventBox()
    req = GenerationRequest(request_id=request_id or uuid.uuid4().hex, prompt=text_prompt, max_tokens=max_tokens,
                            sampling=SamplingParams(temperature=0.0), images=list(images), **kw)
    eng.submit(eng.prepare(req, box))
    return box


def finished(box: EventBox) -> Finished:
    assert box.wait(120), "no end in time"
    assert isinstance(box.last, Finished), box.last
    return box.last


def idle(eng) -> dict:
    stats = wait_for(lambda: (s := eng.stats())["running"] == 0 and s["waiting"] == 0 and s, 60, every=0.02)
    assert stats, eng.stats()
    return stats


def test_usage_counts_the_image_tokens(vision, bundled_spec):
    text_only = finished(run(vision, prompt(bundled_spec, image_first=False), cache_prompt=False))
    pieces = vision.projector.image_pieces(image((200, 30, 30)))
    spans = [p for p in pieces if isinstance(p, ImageSpan)]
    wrap = sum(len(p) for p in pieces if not isinstance(p, ImageSpan))
    for span in spans:
        span.release()
    # idefics3 gives a small image as one slice and its overview
    assert spans and all(s.n_tokens == IMAGE_TOKENS for s in spans)
    rows = sum(s.n_tokens for s in spans)

    with_image = run(vision, prompt(bundled_spec), [image((200, 30, 30))], cache_prompt=False)
    done = finished(with_image)
    assert with_image.started.prompt_tokens == done.prompt_tokens == text_only.prompt_tokens + rows + wrap
    assert done.completion_tokens == 4 and with_image.text
    assert idle(vision)["images_held"] == 0
    # The counting routes' count (no encoder run) is the generation's, and holds nothing after.
    assert vision.count_prompt(prompt(bundled_spec), [image((200, 30, 30))]) == done.prompt_tokens
    assert vision.count_prompt(prompt(bundled_spec, image_first=False), []) == text_only.prompt_tokens
    assert vision.stats()["images_held"] == 0


def test_an_image_decodes_while_a_text_only_request_streams(vision, bundled_spec):
    text = run(vision, prompt(bundled_spec, "Count from one to fifty in words.", image_first=False), max_tokens=24)
    assert wait_for(lambda: text.of(Text), 60, every=0.01), "the text-only request never streamed"
    pictured = run(vision, prompt(bundled_spec), [image((10, 200, 10))], max_tokens=8)
    done = finished(pictured)
    streamed_meanwhile = len(text.of(Text))
    assert finished(text).completion_tokens == 24 and done.completion_tokens == 8
    # The text-only request went on while the image request ran, and was not over before it started.
    assert 0 < streamed_meanwhile
    assert text.text.strip() and pictured.text
    assert idle(vision)["images_held"] == 0


def test_a_different_image_never_reuses_the_cached_kv_of_another(vision, bundled_spec):
    p = prompt(bundled_spec, "Describe the colours of this picture in detail, please.")
    first = finished(run(vision, p, [image((1, 2, 3))]))
    again = finished(run(vision, p, [image((1, 2, 3))]))
    other = finished(run(vision, p, [image((250, 2, 3))]))
    image_start = p.index(IMAGE_MARKER)
    text_before = len(vision.llama.tokenize_prompt(p[:image_start]))
    assert first.prompt_tokens == again.prompt_tokens == other.prompt_tokens
    assert again.cached_tokens == again.prompt_tokens - 1  # the same image: all of it reused
    assert other.cached_tokens <= text_before + 20  # the template's header and mtmd's wrapping tokens at most
    assert other.cached_tokens < first.prompt_tokens - IMAGE_TOKENS
    assert idle(vision)["images_held"] == 0


def test_cancelled_and_failed_image_requests_leave_nothing_behind(vision, bundled_spec):
    running = run(vision, prompt(bundled_spec), [image((5, 5, 250))], max_tokens=100, request_id="running")
    assert wait_for(lambda: running.started, 60, every=0.01)
    vision.cancel("running")
    run(vision, prompt(bundled_spec), [image((6, 6, 250))], max_tokens=100, request_id="queued")
    vision.cancel("queued")  # in the queue or just admitted: either way its image goes
    prepared = vision.prepare(GenerationRequest(request_id="prepared", prompt=prompt(bundled_spec),
                                                images=[image((9, 9, 9))]), EventBox())
    assert vision.stats()["images_held"] >= 1
    vision.discard(prepared)
    with client_error() as err:  # two places, one image: the renderer's bug, a 500
        vision.prepare(GenerationRequest(request_id="x", prompt=prompt(bundled_spec).replace(
            IMAGE_MARKER, IMAGE_MARKER * 2), images=[image((1, 1, 1))]), EventBox())
    assert err.value.status == 500
    stats = idle(vision)
    assert stats["images_held"] == 0 and stats["running"] == 0
    assert finished(run(vision, prompt(bundled_spec), [image((7, 7, 7))])).completion_tokens == 4


def test_a_model_without_projector_refuses_images(engine, bundled_spec):
    with client_error() as err:
        engine.prepare(GenerationRequest(request_id="x", prompt=prompt(bundled_spec), images=[image((0, 0, 0))]),
                       EventBox())
    assert (err.value.status, err.value.code) == (400, "images_unsupported")
    assert "smollm2" in err.value.message


def test_a_typed_marker_stays_text(vision, bundled_spec):
    typed = prompt(bundled_spec, f"What does {IMAGE_MARKER} mean?", image_first=False)
    plain = finished(run(vision, typed, cache_prompt=False))
    assert plain.prompt_tokens == len(vision.llama.tokenize_prompt(typed))
    with client_error() as err:  # the typed marker is no image place
        vision.prepare(GenerationRequest(request_id="x", prompt=typed, images=[image((0, 0, 0))]), EventBox())
    assert err.value.status == 500
    assert idle(vision)["images_held"] == 0


def test_prompt_logprobs_with_images_are_refused(vision, bundled_spec):
    with client_error() as err:
        vision.prepare(GenerationRequest(request_id="x", prompt=prompt(bundled_spec), images=[image((0, 0, 0))],
                                         prompt_logprobs=True), EventBox())
    assert (err.value.status, err.value.code) == (400, "images_unsupported")
