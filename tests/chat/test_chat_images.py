"""Image parts through chat planning and ChatService: where the template puts them, who may send them, and
that they reach the engine in order, loaded by app.images."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from app.api.errors import APIError
from app.api.schemas import parse_chat_request
from app.chat import ChatService
from app.generation.images import load_images
from app.config.app_args import Limits
from app.engine.params import IMAGE_MARKER
from tests.support.engine_errors import mapped_stream
from app.prompt import content_marks
from tests.support.events import run_until_idle as run

pytestmark = pytest.mark.timeout(300)


def png_url(rgb: tuple[int, int, int]) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), rgb).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def request(spec, *parts, role: str = "user", **fields):
    return parse_chat_request({"model": spec.id, "messages": [{"role": role, "content": list(parts)}],
                               "max_tokens": 3, "temperature": 0, **fields})


def text(t: str) -> dict:
    return {"type": "text", "text": t}


def picture(rgb=(200, 10, 10)) -> dict:
    return {"type": "image_url", "image_url": {"url": png_url(rgb)}}


def service(spec, engine, seen=None) -> ChatService:
    async def open_stream(model_id, gen):
        if seen is not None:
            seen.append(gen)
        async for batch in mapped_stream(engine, gen, 0):
            yield batch
    return ChatService([spec], open_stream)


def test_images_reach_the_engine_in_order_and_count_in_usage(vision_spec, vision_engine):
    seen = []
    svc = service(vision_spec, vision_engine, seen)
    plain = run(vision_engine, svc.complete(request(vision_spec, text("Name two colours."))))
    body = run(vision_engine, svc.complete(request(vision_spec, picture((200, 10, 10)), text("Name two colours."),
                                                   picture((10, 10, 200)))))
    gen = seen[-1]
    assert [i.rgb[:3] for i in gen.images] == [bytes((200, 10, 10)), bytes((10, 10, 200))]
    assert sum(text_part.count(IMAGE_MARKER) for text_part, is_content in content_marks.split(gen.prompt)
               if not is_content) == 2
    assert body["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 2 * 16
    assert vision_engine.stats()["images_held"] == 0


def test_a_typed_marker_is_text_and_only_the_part_is_an_image(vision_spec, vision_engine):
    seen = []
    svc = service(vision_spec, vision_engine, seen)
    run(vision_engine, svc.complete(request(vision_spec, text(f"What is {IMAGE_MARKER}?"), picture())))
    gen = seen[-1]
    assert len(gen.images) == 1
    assert len(vision_engine.llama.tokenize_segments(gen.prompt, IMAGE_MARKER)) == 2


def test_a_model_without_projector_names_the_part(bundled_spec, engine):
    svc = service(bundled_spec, engine)
    with pytest.raises(APIError) as err:
        run(engine, svc.complete(request(bundled_spec, text("Look:"), picture())))
    assert (err.value.status, err.value.code, err.value.param) == (400, "images_unsupported", "messages[0].content[1]")


def test_too_many_images_and_images_outside_user_messages_are_refused(vision_spec, vision_engine):
    svc = ChatService([vision_spec], None, limits=Limits(max_images=1))
    with pytest.raises(APIError) as err:
        run(vision_engine, svc.plan(request(vision_spec, picture(), picture())))
    assert (err.value.code, err.value.param) == ("too_many_images", "messages[0].content[1]")
    with pytest.raises(APIError) as err:
        run(vision_engine, svc.plan(request(vision_spec, picture(), role="system")))
    assert err.value.status == 400 and err.value.param == "messages[0].content[0]"


def test_load_images_asks_the_loader_where_each_image_is(vision_spec, monkeypatch):
    import asyncio

    import app.images
    asked = []
    real = app.images.load_images

    async def record(parts, limits, tenant=""):
        asked.extend(where for where, _ in parts)
        return await real(parts, limits, tenant)

    monkeypatch.setattr(app.images, "load_images", record)
    req = request(vision_spec, text("a"), picture(), text("b"), picture())
    assert len(asyncio.run(load_images(req, Limits()))) == 2
    assert asked == ["messages[0].content[1].image_url", "messages[0].content[3].image_url"]
