"""Encoded image bytes to the RGB pixels a projector takes, by Pillow, with the size checked from the
header before any pixel is decoded.

Only PNG, JPEG, WebP, GIF and BMP are opened (Pillow's `formats=`): other plugins never see client bytes
(EPS would start Ghostscript). A declared MIME type must match what the bytes are. Images larger than
limits.max_image_side are scaled down, aspect kept (JPEGs decoded at reduced scale already), so what
crosses to the model replica is bounded whatever was sent; projectors resize to their own input anyway."""

from __future__ import annotations

import hashlib
import io
import warnings

from PIL import Image, ImageOps

from ..api.errors import invalid_request
from ..config.settings import Limits
from ..engine.params import ImageInput
from .source import EncodedImage

FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif", "BMP": "image/bmp"}
_ALIASES = {"image/jpg": "image/jpeg", "image/x-ms-bmp": "image/bmp", "image/x-png": "image/png"}


def decode_image(image: EncodedImage, where: str, limits: Limits) -> ImageInput:
    declared = _ALIASES.get(image.mime, image.mime)
    if declared and declared not in FORMATS.values():
        raise invalid_request(f"The image at `{where}` is declared as `{image.mime}`; this server reads "
                              f"{', '.join(FORMATS.values())}.", param=where, code="unsupported_image_type")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(image.data), formats=list(FORMATS)) as im:
                actual = FORMATS[im.format]
                if declared and declared != actual:
                    raise invalid_request(f"The image at `{where}` is declared as `{image.mime}` but is {actual}.",
                                          param=where, code="unsupported_image_type")
                width, height = im.size
                if width < 1 or height < 1 or width * height > limits.max_image_pixels:
                    raise invalid_request(f"The image at `{where}` is {width}x{height} pixels; this server takes "
                                          f"at most {limits.max_image_pixels} pixels per image "
                                          f"(limits.max_image_pixels).", param=where, code="image_too_large")
                rgb = _pixels(im, limits.max_image_side)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        # Pillow's own bound, far above ours: a header claiming billions of pixels.
        raise invalid_request(f"The image at `{where}` claims more pixels than this server decodes "
                              f"({limits.max_image_pixels} per image, limits.max_image_pixels).", param=where,
                              code="image_too_large") from None
    except Image.UnidentifiedImageError:
        raise invalid_request(f"The data at `{where}` is not an image this server reads "
                              f"({', '.join(FORMATS)}).", param=where, code="invalid_image") from None
    except (OSError, SyntaxError, ValueError, EOFError, MemoryError) as exc:
        # Truncated or corrupt data: Pillow finds out while decoding pixels.
        raise invalid_request(f"The image at `{where}` could not be decoded ({type(exc).__name__}: "
                              f"{str(exc)[:120]}).", param=where, code="invalid_image") from None
    return ImageInput(width=rgb.width, height=rgb.height, rgb=rgb.tobytes(),
                      digest=hashlib.sha256(image.data).hexdigest())


def _pixels(im: Image.Image, max_side: int) -> Image.Image:
    if im.format == "JPEG":
        im.draft("RGB", (max_side, max_side))  # DCT scaling: decode a large photo at a fraction of its size
    im.load()
    im = ImageOps.exif_transpose(im)  # phone photos: upright as the camera meant them
    if max(im.size) > max_side:
        im.thumbnail((max_side, max_side), Image.Resampling.BICUBIC)
    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")  # transparent parts shown on white
    return im.convert("RGB")
