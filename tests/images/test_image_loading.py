"""Image parts' URLs to RGB pixels: what is read, what is refused with a 400 naming the part, and the
bounds that hold before any pixel is decoded."""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import threading
import time

import pytest
from PIL import Image

from app.api.errors import APIError
from app.config.app_args import Limits
from app.images import load_image
from tests.support.hostile_images import HOSTILE_IMAGES, RED, data_url, encode, png_claiming, solid

WHERE = "messages[0].content[1].image_url"


def load(url: str, limits: Limits | None = None):
    return asyncio.run(load_image(url, WHERE, limits or Limits()))


def refusal(url: str, limits: Limits | None = None) -> APIError:
    with pytest.raises(APIError) as info:
        load(url, limits)
    assert info.value.status == 400 and info.value.param == WHERE, info.value
    return info.value


def test_a_png_becomes_its_rgb_pixels():
    image = load(data_url(solid((10, 200, 30), (5, 3))))
    assert (image.width, image.height) == (5, 3)
    assert image.rgb == bytes([10, 200, 30]) * 15
    assert image.digest == hashlib.sha256(solid((10, 200, 30), (5, 3))).hexdigest()


@pytest.mark.parametrize("fmt,mime", [("JPEG", "image/jpeg"), ("WEBP", "image/webp"), ("GIF", "image/gif"),
                                      ("BMP", "image/bmp"), ("JPEG", "image/jpg"), ("PNG", "")])
def test_each_format_is_read_under_its_mime_type(fmt, mime):
    image = load(data_url(solid((0, 0, 255), (16, 16), fmt), mime))
    r, g, b = image.rgb[:3]
    assert (image.width, image.height) == (16, 16) and b > 200 and r < 40 and g < 40


def test_transparent_pixels_are_shown_on_white():
    image = load(data_url(encode(Image.new("RGBA", (2, 2), (255, 0, 0, 0)))))
    assert image.rgb == b"\xff" * 12


def test_large_images_are_scaled_down_aspect_kept():
    image = load(data_url(solid((1, 2, 3), (400, 100))), Limits(max_image_side=100))
    assert (image.width, image.height) == (100, 25)
    assert len(image.rgb) == 100 * 25 * 3


def test_a_phone_photo_is_turned_upright():
    im = Image.new("RGB", (40, 20), (0, 255, 0))
    exif = im.getexif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to view
    image = load(data_url(encode(im, "JPEG", exif=exif), "image/jpeg"))
    assert (image.width, image.height) == (20, 40)


@pytest.mark.parametrize("name,url,code", HOSTILE_IMAGES, ids=[c[0] for c in HOSTILE_IMAGES])
def test_hostile_images_get_a_400_naming_the_part(name, url, code):
    assert refusal(url).code == code, name


def test_bytes_are_bounded_before_decoding_base64():
    limits = Limits(max_image_bytes=1024)
    assert refusal(data_url(solid((1, 1, 1), (200, 200), "BMP")), limits).code == "image_too_large"
    # Not even valid base64: the length alone refuses it.
    assert refusal("data:image/png;base64," + "@" * 4000, limits).code == "image_too_large"


def test_pixels_are_bounded_from_the_header():
    assert refusal(data_url(png_claiming(101, 100)), Limits(max_image_pixels=10_000)).code == "image_too_large"
    image = load(data_url(solid((9, 9, 9), (100, 100))), Limits(max_image_pixels=10_000))
    assert image.width == 100


class _Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/red.png":
            body = RED
        elif self.path == "/slow.png":
            time.sleep(3)
            body = RED
        elif self.path == "/big.png":
            body = solid((0, 0, 0), (300, 300), "BMP")
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png" if self.path == "/red.png" else "image/bmp")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def image_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_urls_are_fetched_only_when_the_config_allows(image_server):
    assert refusal(f"{image_server}/red.png").code == "image_url_not_allowed"
    allowed = Limits(image_url_fetch=True)
    image = load(f"{image_server}/red.png", allowed)
    assert image.rgb[:3] == b"\xff\x00\x00"
    assert refusal(f"{image_server}/missing.png", allowed).code == "image_fetch_failed"
    assert refusal(f"{image_server}/big.png", Limits(image_url_fetch=True, max_image_bytes=4096)).code == "image_too_large"
    assert refusal("http://127.0.0.1:9/x.png", allowed).code == "image_fetch_failed"  # nothing listens there
    started = time.monotonic()
    slow = refusal(f"{image_server}/slow.png", Limits(image_url_fetch=True, image_fetch_timeout_s=0.3))
    assert slow.code == "image_fetch_failed" and time.monotonic() - started < 2.5
