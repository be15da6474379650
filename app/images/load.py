"""Image parts' URLs to ImageInput (the count per request is checked with the request: app/generation/images.py).

A request's images are loaded one after another (a request holds one image's decoding memory and one
decoding thread at a time; its first bad image ends it), each decoded on the decoding pool (pool.py),
all within one deadline (limits.image_decode_timeout_s, at most the request's own) and one budget of
decoded bytes (limits.max_image_bytes_decoded)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from ..api.errors import invalid_request, overloaded
from ..config.app_args import Limits
from ..engine.params import ImageInput
from .decode import DecodeBudget, decode_image
from ..tenants.prep_pool import PoolFull, PreparationPool
from .pool import POOL
from .source import read_source


async def load_image(url: str, where: str, limits: Limits, tenant: str = "") -> ImageInput:
    """The image an `image_url` part names (`where`: the part's path, for errors); a 400 otherwise."""
    return (await load_images([(where, url)], limits, tenant))[0]


async def load_images(parts: Iterable[tuple[str, str]], limits: Limits, tenant: str = "",
                      pool: PreparationPool = POOL) -> list[ImageInput]:
    """The images of (where, url) parts, in order, within one deadline and one decoded-bytes budget, decoded in
    the turn of the request's key (`tenant`)."""
    budget = DecodeBudget(limits)
    timeout_s = min(limits.image_decode_timeout_s, limits.request_timeout_s)
    deadline = time.monotonic() + timeout_s
    loaded = []
    for where, url in parts:
        if not isinstance(url, str) or not url:
            raise invalid_request(f"`{where}` must be a URL string.", param=where, code="invalid_image_url")
        encoded = await read_source(url, where, limits)
        try:
            job = pool.submit(tenant, decode_image, encoded, where, limits, budget)
        except PoolFull:
            raise overloaded("Too many images are waiting to be decoded; retry shortly.") from None
        try:
            loaded.append(await asyncio.wait_for(asyncio.shield(job.future), max(0.0, deadline - time.monotonic())))
        except TimeoutError:
            if job.future.done() and not job.future.cancelled() and job.future.exception() is None:
                loaded.append(job.future.result())  # finished as the deadline passed
                continue
            if not pool.cancel(job):  # still queued behind other images: the server is busy, not the image
                raise overloaded("Too many images are waiting to be decoded; retry shortly.") from None
            # Its decoding thread runs on to the end (scans and pixels bound it); the client does not wait.
            raise invalid_request(f"Decoding the images of this request took longer than {timeout_s:g} s "
                                  f"(limits.image_decode_timeout_s), at `{where}`.", param=where,
                                  code="image_too_complex") from None
        except BaseException:
            pool.cancel(job)
            raise
    return loaded
