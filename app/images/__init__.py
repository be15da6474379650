"""Image inputs: a URL in a request -> the decoded, checked ImageInput the engine takes.

Placeholder until the real loader lands (data URLs decoded with Pillow, http(s) fetched when allowed):
the chat side is written against this signature."""

from __future__ import annotations

from ..config.settings import Limits
from ..engine.params import ImageInput


async def load_image(url: str, where: str, limits: Limits) -> ImageInput:
    """The image at `url` (a request's `where`, named in its 400s), within `limits`."""
    raise NotImplementedError("app.images.load_image is not there yet")
