"""An image part's URL to ImageInput (the count per request is checked with the request: app/chat/images.py)."""

from __future__ import annotations

import asyncio

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
