"""Client bytes that Pillow chokes on or takes long over: every failure is a 400 naming the part (a fuzz
over mutated real images proves no other outcome), a multi-picture JPEG is read as its first picture, and
decoding is bounded in scans, decoded bytes per request and time, on threads of its own."""

from __future__ import annotations

import asyncio
import io
import random
import threading

import pytest
from PIL import Image

from app.api.errors import APIError
from app.config.app_args import Limits
from app.engine.params import ImageInput
from app.images import load, load_images
from app.images.decode import decode_image
from app.images.jpeg_scans import jpeg_scans
from app.tenants.prep_pool import PreparationPool
from app.images.source import EncodedImage
from tests.support.hostile_images import (bad_exif, data_url, encode, exif_with, mpo, progressive_jpeg,
                                          repeat_last_scan, solid)

WHERE = "messages[0].content[1].image_url"


def refusal(data: bytes, mime: str = "", limits: Limits | None = None) -> APIError:
    with pytest.raises(APIError) as info:
        decode_image(EncodedImage(data, mime), WHERE, limits or Limits())
    assert info.value.status == 400 and info.value.param == WHERE, info.value
    return info.value


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
@pytest.mark.parametrize("tag", [0x011A, 0x0128])  # XResolution (TypeError), ResolutionUnit (struct.error)
def test_exif_orientation_beside_a_tag_of_the_wrong_type_is_invalid_image(fmt, tag):
    assert refusal(bad_exif(fmt, tag)).code == "invalid_image"


def test_a_multi_picture_jpeg_is_read_as_a_jpeg_its_first_picture():
    data = mpo((255, 0, 0), (0, 0, 255))
    assert Image.open(io.BytesIO(data)).format == "MPO"
    image = decode_image(EncodedImage(data, "image/jpeg"), WHERE, Limits())
    r, g, b = image.rgb[:3]
    assert (image.width, image.height) == (64, 48) and r > 200 and b < 40, image.rgb[:3]
    assert refusal(data, "image/png").code == "unsupported_image_type"


def test_scans_are_counted_up_to_the_first_image_end():
    assert jpeg_scans(solid((1, 2, 3), fmt="JPEG")) == 1
    assert jpeg_scans(progressive_jpeg()) == 10  # libjpeg's progression for three components
    assert jpeg_scans(repeat_last_scan(progressive_jpeg(), 25)) == 35
    assert jpeg_scans(mpo((1, 2, 3), (4, 5, 6))) == 1  # the first picture's; the second is not decoded
    # An SOS marker's bytes inside an APP1 segment (EXIF) are skipped with their segment.
    sos_in_exif = encode(Image.new("RGB", (8, 8)), "JPEG", exif=exif_with([(0x010E, 7, 4, b"\xff\xda\x00\x08")]))
    assert sos_in_exif.count(b"\xff\xda") == 2 and jpeg_scans(sos_in_exif) == 1


def test_a_jpeg_with_too_many_scans_is_refused_before_decoding():
    bomb = repeat_last_scan(progressive_jpeg(), 200)
    error = refusal(bomb, "image/jpeg")
    assert error.code == "image_too_complex" and "limits.max_jpeg_scans" in error.message
    assert decode_image(EncodedImage(bomb, ""), WHERE, Limits(max_jpeg_scans=300)).width == 64  # it is valid


def test_a_requests_images_share_one_decoded_bytes_budget():
    url = data_url(solid((0, 255, 0), (64, 48)))  # 9,216 bytes decoded
    parts = [(f"messages[0].content[{i}].image_url", url) for i in range(3)]
    limits = Limits(max_image_bytes_decoded=2 * 64 * 48 * 3)
    assert len(asyncio.run(load_images(parts[:2], limits))) == 2
    with pytest.raises(APIError) as info:
        asyncio.run(load_images(parts, limits))
    assert (info.value.status, info.value.code, info.value.param) == (400, "image_too_large", parts[2][0])
    assert "limits.max_image_bytes_decoded" in info.value.message


def test_images_are_decoded_on_their_own_threads(monkeypatch):
    names = []
    real = load.decode_image
    monkeypatch.setattr(load, "decode_image", lambda *a: (names.append(threading.current_thread().name), real(*a))[1])
    asyncio.run(load_images([(WHERE, data_url(solid((1, 2, 3))))], Limits()))
    assert names and names[0].startswith("image-decode")


def blocked_pool(monkeypatch, threads: int = 1, max_waiting: int = 4) -> tuple[PreparationPool, threading.Event]:
    """A pool whose decoding waits on an event: what a slow image looks like."""
    release = threading.Event()
    real = load.decode_image
    monkeypatch.setattr(load, "decode_image", lambda *a: (release.wait(30), real(*a))[1])
    return PreparationPool("image-decode", threads, per_key=1, max_waiting=max_waiting), release


def test_an_image_past_the_decoding_deadline_is_too_complex_and_one_still_queued_is_overloaded(monkeypatch):
    pool, release = blocked_pool(monkeypatch)
    limits = Limits(image_decode_timeout_s=0.3)
    url = data_url(solid((1, 2, 3)))

    async def two_requests():
        return await asyncio.gather(load_images([(WHERE, url)], limits, pool=pool), load_images([(WHERE, url)], limits, pool=pool),
                                    return_exceptions=True)
    try:
        first, second = asyncio.run(two_requests())
    finally:
        release.set()
    assert (first.status, first.code, first.param) == (400, "image_too_complex", WHERE)
    assert (second.status, second.code) == (503, "overloaded")  # it waited behind the first


def test_the_decoding_queue_is_bounded(monkeypatch):
    pool, release = blocked_pool(monkeypatch, threads=1, max_waiting=0)
    url = data_url(solid((1, 2, 3)))

    async def two_requests():
        running = asyncio.create_task(load_images([(WHERE, url)], Limits(), pool=pool))
        await asyncio.sleep(0)  # the first holds the only place
        try:
            with pytest.raises(APIError) as info:
                await load_images([(WHERE, url)], Limits(), pool=pool)
        finally:
            release.set()
        return info.value, await running
    refused, served = asyncio.run(two_requests())
    assert (refused.status, refused.code) == (503, "overloaded")
    assert [type(i) for i in served] == [ImageInput]


# The fuzz: real images of every format read, made by Pillow, then mutated (seeded, bounded).
def seeds() -> dict[str, bytes]:
    gradient = Image.linear_gradient("L").resize((24, 16)).convert("RGB")
    frames = [gradient, Image.new("RGB", (24, 16), (0, 0, 255))]
    exif = exif_with([(0x0112, 3, 1, b"\x06\x00\x00\x00"), (0x0128, 3, 1, b"\x02\x00\x00\x00")])
    return {
        "png": encode(gradient), "png rgba": encode(gradient.convert("RGBA")),
        "png palette": encode(gradient.convert("P")), "jpeg": encode(gradient, "JPEG", exif=exif),
        "progressive jpeg": encode(gradient, "JPEG", progressive=True), "mpo": encode(frames[0], "MPO", save_all=True,
                                                                                       append_images=frames[1:]),
        "webp": encode(gradient, "WEBP", exif=exif), "webp lossless": encode(gradient, "WEBP", lossless=True),
        "gif": encode(frames[0], "GIF", save_all=True, append_images=frames[1:]), "bmp": encode(gradient, "BMP"),
    }


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    kind = rng.randrange(5)
    if kind == 0:  # flip a few bytes
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == 1:  # truncate
        del b[rng.randrange(1, len(b)):]
    elif kind == 2:  # repeat a slice (chunks, segments, scans)
        i = rng.randrange(len(b))
        j = min(len(b), i + rng.randint(1, 64))
        b[j:j] = b[i:j] * rng.randint(1, 8)
    elif kind == 3:  # extreme 16-bit values (sizes, lengths, counts, tags)
        i = rng.randrange(len(b) - 1)
        b[i:i + 2] = rng.choice([b"\xff\xff", b"\x00\x00", b"\x7f\xff", b"\x80\x00"])
    else:  # random bytes inserted
        i = rng.randrange(len(b))
        b[i:i] = rng.randbytes(rng.randint(1, 16))
    return bytes(b)


@pytest.mark.filterwarnings("ignore")  # Pillow warns about corrupt EXIF and truncated files
@pytest.mark.parametrize("name", sorted(seeds()))
def test_fuzz_every_outcome_is_an_image_or_a_400_naming_the_part(name):
    rng = random.Random(f"llamaray-images-{name}")
    limits = Limits(max_image_pixels=512 * 512)  # a mutated size stays cheap to decode
    seed = seeds()[name]
    outcomes = set()
    for _ in range(300):
        data = mutate(seed, rng)
        try:
            image = decode_image(EncodedImage(data, ""), WHERE, limits)
        except APIError as exc:
            assert exc.status == 400 and exc.param == WHERE, exc
            assert exc.code in ("invalid_image", "image_too_large", "image_too_complex"), exc
            outcomes.add(exc.code)
        else:
            assert image.width >= 1 and image.height >= 1 and len(image.rgb) == image.width * image.height * 3
            outcomes.add("image")
    assert "invalid_image" in outcomes, outcomes  # the mutations did reach the decoder's failures
