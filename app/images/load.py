"""An image part's URL to ImageInput, and a request's images within its count limit."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ..api.errors import invalid_request
from ..config.settings import Limits
from ..engine.params import ImageInput
from .decode import decode_image
from .source import read_source


async def load_image(url: str, where: str, limits: Limits) -> ImageInput:
    """The image an `image_url` part names (`where`: the part's path, for errors); a 400 otherwise.
    Decoding is CPU work, done off the event loop."""
    if not isinstance(url, str) or not url:
        raise invalid_request(f"`{where}` must be a URL string.", param=where, code="invalid_image_url")
    encoded = await read_source(url, where, limits)
    return await asyncio.to_thread(decode_image, encoded, where, limits)


async def load_images(parts: Sequence[tuple[str, str]], limits: Limits) -> list[ImageInput]:
    """A request's images, (url, where) in prompt order: refused past limits.max_images before any is
    read, then read one after another so one request decodes one image at a time."""
    if len(parts) > limits.max_images:
        where = parts[limits.max_images][1]
        raise invalid_request(f"The request has {len(parts)} images; this server takes at most {limits.max_images} "
                              f"per request (limits.max_images).", param=where, code="too_many_images")
    return [await load_image(url, where, limits) for url, where in parts]
