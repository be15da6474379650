"""Images for tests, as data URLs: plain ones made with Pillow, and hostile ones that must each get a 400
naming the image part and leave the server as it was."""

from __future__ import annotations

import base64
import io
import struct
import zlib

from PIL import Image


def encode(im: Image.Image, fmt: str = "PNG", **save) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **save)
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def solid(colour: tuple[int, int, int], size: tuple[int, int] = (64, 64), fmt: str = "PNG") -> bytes:
    return encode(Image.new("RGB", size, colour), fmt)


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def png_claiming(width: int, height: int) -> bytes:
    """A valid PNG header for a width x height RGB image, with a few bytes of deflated zeros: a
    decompression bomb's shape (decoded it would take width * height * 3 bytes)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    rows = zlib.compress(b"\x00" * 1024, 9)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", rows) + _png_chunk(b"IEND", b"")


RED = solid((255, 0, 0))
# (name, image_url's url, expected error code)
HOSTILE_IMAGES = [
    ("truncated PNG", data_url(RED[: len(RED) // 2]), "invalid_image"),
    ("decompression bomb (PNG claiming 100k x 100k)", data_url(png_claiming(100_000, 100_000)), "image_too_large"),
    ("PNG over max_image_pixels (5000 x 4000)", data_url(png_claiming(5000, 4000)), "image_too_large"),
    ("text declared as text/plain", data_url(b"hello", "text/plain"), "unsupported_image_type"),
    ("JPEG declared as image/png", data_url(solid((0, 0, 255), fmt="JPEG"), "image/png"), "unsupported_image_type"),
    ("EPS (Ghostscript) declared as nothing", "data:;base64," + base64.b64encode(
        b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n").decode(), "invalid_image"),
    ("not base64", "data:image/png;base64,@@@@", "invalid_image"),
    ("empty data URL", "data:image/png;base64,", "invalid_image"),
    ("file:// URL", "file:///etc/passwd", "invalid_image_url"),
    ("http URL while fetching is off", "http://169.254.169.254/latest/meta-data/", "image_url_not_allowed"),
]


def exif_with(entries: list[tuple[int, int, int, bytes]]) -> bytes:
    """EXIF (as Pillow's `exif=` takes it): a little-endian TIFF IFD of (tag, type, count, 4 value bytes)."""
    ifd = b"".join(struct.pack("<HHI", tag, kind, count) + value for tag, kind, count, value in entries)
    return b"Exif\x00\x00II*\x00" + struct.pack("<IH", 8, len(entries)) + ifd + struct.pack("<I", 0)


ORIENTATION_6 = (0x0112, 3, 1, struct.pack("<HH", 6, 0))  # rotated 90 degrees: exif_transpose turns it


def bad_exif(fmt: str, wrong_tag: int = 0x011A, wrong_type: int = 2) -> bytes:
    """A small image whose EXIF has Orientation beside a tag stored with the wrong type (XResolution as
    ASCII: Pillow's exif_transpose raises TypeError rewriting it; ResolutionUnit (0x0128) as ASCII:
    struct.error)."""
    return encode(Image.new("RGB", (8, 4), (255, 0, 0)), fmt,
                  exif=exif_with([ORIENTATION_6, (wrong_tag, wrong_type, 1, b"1\x00\x00\x00")]))


def mpo(*colours: tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> bytes:
    """A multi-picture JPEG (what phones and cameras write), one solid picture per colour."""
    first, *rest = [Image.new("RGB", size, c) for c in colours]
    return encode(first, "MPO", save_all=True, append_images=rest)


def progressive_jpeg(size: tuple[int, int] = (64, 48), colour: tuple[int, int, int] = (255, 0, 0)) -> bytes:
    return encode(Image.new("RGB", size, colour), "JPEG", progressive=True, quality=90)


def repeat_last_scan(jpeg: bytes, times: int) -> bytes:
    """A progressive JPEG with its last scan (SOS to EOI) repeated: a few kB that libjpeg decodes scan by
    scan, each scan walking every block of the image."""
    last = jpeg.rindex(b"\xff\xda")
    end = jpeg.rindex(b"\xff\xd9")
    return jpeg[:end] + jpeg[last:end] * times + jpeg[end:]


def scan_bomb(times: int = 3000, size: tuple[int, int] = (4096, 4096)) -> bytes:
    """The largest picture the server takes, its last scan repeated `times` times (about 64 kB)."""
    return repeat_last_scan(progressive_jpeg(size, (200, 30, 30)), times)
