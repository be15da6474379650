"""Encoded image bytes to the RGB pixels a projector takes, by Pillow, with the size checked from the
header before any pixel is decoded.

Only PNG, JPEG, WebP, GIF and BMP are opened (Pillow's `formats=`): other plugins never see client bytes
(EPS would start Ghostscript). A multi-picture JPEG (MPO: what many phones and cameras write) is a JPEG,
and its first picture is the one read. A declared MIME type must match what the bytes are. Images larger
than limits.max_image_side are scaled down, aspect kept (JPEGs decoded at reduced scale already), so what
crosses to the model replica is bounded whatever was sent; projectors resize to their own input anyway.

The bytes are the client's: whatever Pillow raises on them (a corrupt chunk, an EXIF tag of the wrong
type, a struct that does not unpack) is a 400 `invalid_image` naming the part, never a 500."""

from __future__ import annotations

import hashlib
import io

from PIL import Image, ImageOps

from ..api.errors import APIError, invalid_request
from ..config.app_args import Limits
from ..engine.params import ImageInput
from .jpeg_scans import jpeg_scans
from .source import EncodedImage

# The plugins Pillow may open client bytes with (an MPO is opened by the JPEG plugin).
OPENERS = ["PNG", "JPEG", "WEBP", "GIF", "BMP"]
FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "MPO": "image/jpeg", "WEBP": "image/webp",
           "GIF": "image/gif", "BMP": "image/bmp"}
_ALIASES = {"image/jpg": "image/jpeg", "image/x-ms-bmp": "image/bmp", "image/x-png": "image/png"}
_RGB_BYTES = 3


class DecodeBudget:
    """What one request's images may decode to, together (limits.max_image_bytes_decoded): each image's
    pixels as its header declares them, taken before they are decoded."""

    def __init__(self, limits: Limits) -> None:
        self.total = limits.max_image_bytes_decoded
        self.left = self.total

    def take(self, where: str, width: int, height: int) -> None:
        need = width * height * _RGB_BYTES
        if need > self.left:
            raise invalid_request(f"The image at `{where}` ({width}x{height} pixels, {need} bytes decoded) would "
                                  f"take this request's images past {self.total} decoded bytes "
                                  f"(limits.max_image_bytes_decoded).", param=where, code="image_too_large")
        self.left -= need


def decode_image(image: EncodedImage, where: str, limits: Limits, budget: DecodeBudget | None = None) -> ImageInput:
    declared = _ALIASES.get(image.mime, image.mime)
    if declared and declared not in FORMATS.values():
        raise invalid_request(f"The image at `{where}` is declared as `{image.mime}`; this server reads "
                              f"{', '.join(OPENERS)}.", param=where, code="unsupported_image_type")
    try:
        with Image.open(io.BytesIO(image.data), formats=OPENERS) as im:
            actual = FORMATS[im.format]
            if declared and declared != actual:
                raise invalid_request(f"The image at `{where}` is declared as `{image.mime}` but is {actual}.",
                                      param=where, code="unsupported_image_type")
            width, height = im.size
            if width < 1 or height < 1 or width * height > limits.max_image_pixels:
                raise invalid_request(f"The image at `{where}` is {width}x{height} pixels; this server takes "
                                      f"at most {limits.max_image_pixels} pixels per image "
                                      f"(limits.max_image_pixels).", param=where, code="image_too_large")
            if actual == "image/jpeg" and (scans := jpeg_scans(image.data)) > limits.max_jpeg_scans:
                raise invalid_request(f"The JPEG at `{where}` has {scans} scans; this server decodes at most "
                                      f"{limits.max_jpeg_scans} (limits.max_jpeg_scans).", param=where,
                                      code="image_too_complex")
            if budget is not None:
                budget.take(where, width, height)
            rgb = _pixels(im, limits.max_image_side)
    except APIError:
        raise
    except Image.DecompressionBombError:
        # Pillow's own bound, far above ours: a header claiming billions of pixels.
        raise invalid_request(f"The image at `{where}` claims more pixels than this server decodes "
                              f"({limits.max_image_pixels} per image, limits.max_image_pixels).", param=where,
                              code="image_too_large") from None
    except Image.UnidentifiedImageError:
        raise invalid_request(f"The data at `{where}` is not an image this server reads "
                              f"({', '.join(OPENERS)}).", param=where, code="invalid_image") from None
    except Exception as exc:  # noqa: BLE001 - any failure on the client's bytes is the client's (see above)
        raise invalid_request(f"The image at `{where}` could not be decoded ({type(exc).__name__}: "
                              f"{str(exc)[:120]}).", param=where, code="invalid_image") from None
    return ImageInput(width=rgb.width, height=rgb.height, rgb=rgb.tobytes(),
                      digest=hashlib.sha256(image.data).hexdigest())


def _pixels(im: Image.Image, max_side: int) -> Image.Image:
    if im.format in ("JPEG", "MPO"):
        im.draft("RGB", (max_side, max_side))  # DCT scaling: decode a large photo at a fraction of its size
    im.load()  # an MPO's first picture: it opens at frame 0
    im = ImageOps.exif_transpose(im)  # phone photos: upright as the camera meant them
    if max(im.size) > max_side:
        im.thumbnail((max_side, max_side), Image.Resampling.BICUBIC)
    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")  # transparent parts shown on white
    return im.convert("RGB")
