"""A chat request's images: where its `image_url` parts are, checked against the model, then loaded.

The template writes IMAGE_MARKER where each part was (chat_template.py), in message and part order, and
the engine pairs the markers with GenerationRequest.images in that same order: `image_parts` is that
order, the one place it is decided."""

from __future__ import annotations

from typing import Any

from ..api.errors import invalid_request
from ..api.schemas import ChatCompletionRequest
from ..config.app_args import Limits
from ..config.spec import ModelSpec
from ..engine.params import ImageInput
from .. import images as image_loader


def image_parts(req: ChatCompletionRequest) -> list[tuple[str, str, Any]]:
    """(where, its message's role, the part's `image_url` value) of each image part, in prompt order."""
    found = []
    for i, msg in enumerate(req.messages):
        for j, part in enumerate(msg.content if isinstance(getattr(msg, "content", None), list) else []):
            if part.type == "image_url":
                found.append((f"messages[{i}].content[{j}]", msg.role, part.image_url))
    return found


def check_images(req: ChatCompletionRequest, spec: ModelSpec, limits: Limits) -> None:
    """Image parts only in user messages, only for a model with a projector, at most limits.max_images."""
    parts = image_parts(req)
    if not parts:
        return
    if not spec.takes_images:
        raise invalid_request(f"Model `{spec.id}` takes no images (it has no multimodal projector).",
                              param=parts[0][0], code="images_unsupported")
    for where, role, value in parts:
        if role != "user":
            raise invalid_request(f"Images are taken in `user` messages only, not `{role}`.",
                                  param=where, code="unsupported_content")
        if not isinstance(value, dict) or not isinstance(value.get("url"), str):
            raise invalid_request("An `image_url` part needs `image_url.url`, a string.", param=f"{where}.image_url",
                                  code="invalid_image")
    if len(parts) > limits.max_images:
        raise invalid_request(f"Too many images: {len(parts)} (at most {limits.max_images}, limits.max_images).",
                              param=parts[limits.max_images][0], code="too_many_images")


async def load_images(req: ChatCompletionRequest, limits: Limits, tenant: str = "") -> list[ImageInput]:
    """Every image of the request (checked by check_images), in prompt order (app/images/load.py: one after
    another, within one deadline and one decoded-bytes budget)."""
    return await image_loader.load_images([(f"{where}.image_url", value["url"]) for where, _, value in image_parts(req)],
                                          limits, tenant)
