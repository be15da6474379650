"""Where an image's bytes come from: a `data:` URL, or an `http(s)` URL fetched when the config allows it.

Both are bounded before the bytes exist in full: a data URL by the length of its base64 text, a fetch by
its Content-Length and then by counting what arrives, under one deadline."""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes, urlsplit

import httpx

from ..api.errors import invalid_request
from ..config.app_args import Limits

_DATA_URL = re.compile(r"data:(?P<mime>[^;,]*)(?P<params>(?:;[^;,]*)*),", re.IGNORECASE)


@dataclass(frozen=True)
class EncodedImage:
    data: bytes
    mime: str  # as declared ("image/png"), lower case; "" when the source declared none


def too_large(where: str, size: int, limits: Limits) -> Exception:
    return invalid_request(f"The image at `{where}` is {size} bytes; this server takes images of at most "
                           f"{limits.max_image_bytes} bytes (limits.max_image_bytes).", param=where,
                           code="image_too_large")


def from_data_url(url: str, where: str, limits: Limits) -> EncodedImage:
    match = _DATA_URL.match(url)
    if match is None:
        raise invalid_request(f"`{where}` is not a valid data URL (`data:image/png;base64,...`).", param=where,
                              code="invalid_image_url")
    payload = url[match.end():]
    is_base64 = any(p.strip().lower() == "base64" for p in match["params"].split(";"))
    # Every 4 base64 characters make 3 bytes: refuse before decoding anything.
    estimate = len(payload) * 3 // 4 if is_base64 else len(payload)
    if estimate > limits.max_image_bytes + 3:
        raise too_large(where, estimate, limits)
    try:
        data = base64.b64decode(payload, validate=True) if is_base64 else unquote_to_bytes(payload)
    except (binascii.Error, ValueError):
        raise invalid_request(f"The data URL at `{where}` is not valid base64.", param=where,
                              code="invalid_image") from None
    if len(data) > limits.max_image_bytes:
        raise too_large(where, len(data), limits)
    return EncodedImage(data, match["mime"].strip().lower())


async def fetch(url: str, where: str, limits: Limits) -> EncodedImage:
    """The image at an http(s) URL, within limits.max_image_bytes and limits.image_fetch_timeout_s."""
    deadline = limits.image_fetch_timeout_s
    try:
        async with asyncio.timeout(deadline):
            async with httpx.AsyncClient(follow_redirects=True, max_redirects=3, timeout=deadline) as client:
                async with client.stream("GET", url, headers={"Accept": "image/*"}) as response:
                    if response.status_code != 200:
                        raise invalid_request(f"Fetching the image at `{where}` got HTTP {response.status_code}.",
                                              param=where, code="image_fetch_failed")
                    declared = response.headers.get("content-length", "")
                    if declared.isdigit() and int(declared) > limits.max_image_bytes:
                        raise too_large(where, int(declared), limits)
                    body = bytearray()
                    async for chunk in response.aiter_bytes():
                        body += chunk
                        if len(body) > limits.max_image_bytes:
                            raise too_large(where, len(body), limits)
                    mime = response.headers.get("content-type", "").split(";")[0].strip().lower()
                    return EncodedImage(bytes(body), mime)
    except TimeoutError:
        raise invalid_request(f"Fetching the image at `{where}` took longer than {deadline:g} s "
                              f"(limits.image_fetch_timeout_s).", param=where, code="image_fetch_failed") from None
    except httpx.HTTPError as exc:
        raise invalid_request(f"The image at `{where}` could not be fetched: {type(exc).__name__}.", param=where,
                              code="image_fetch_failed") from None


async def read_source(url: str, where: str, limits: Limits) -> EncodedImage:
    scheme = urlsplit(url).scheme.lower() if isinstance(url, str) else ""
    if scheme == "data":
        return from_data_url(url, where, limits)
    if scheme in ("http", "https"):
        if not limits.image_url_fetch:
            # Fetching what a client names would let it make this server call any address it can reach.
            raise invalid_request(f"`{where}` is an {scheme} URL; this server takes images as `data:` URLs only "
                                  f"(limits.image_url_fetch is off).", param=where, code="image_url_not_allowed")
        return await fetch(url, where, limits)
    raise invalid_request(f"`{where}` must be a `data:` URL (base64 image)"
                          + (" or an http(s) URL" if limits.image_url_fetch else "") + ".", param=where,
                          code="invalid_image_url")
