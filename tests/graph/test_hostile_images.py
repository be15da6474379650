"""Images that make Pillow raise or work for long, through the real graph in both topologies: each is a
400 naming the image on every route that reads images (chat, Responses, Messages, whole and streamed, and
both counting routes), a multi-picture JPEG (what phones write) is read as its first picture, and image
bombs from one key leave another key's plain request served; no replica is replaced."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.hostile_images import bad_exif, data_url, mpo, progressive_jpeg, repeat_last_scan, scan_bomb
from tests.support.serve_harness import KEY_A, KEY_B, MODEL

# (name, encoded bytes, MIME type, the code a chat request gets)
BAD = [
    ("PNG, EXIF tag of the wrong type (TypeError)", bad_exif("PNG"), "image/png", "invalid_image"),
    ("JPEG, EXIF tag of the wrong type (struct.error)", bad_exif("JPEG", 0x0128), "image/jpeg", "invalid_image"),
    ("WebP, EXIF tag of the wrong type", bad_exif("WEBP"), "image/webp", "invalid_image"),
    ("progressive JPEG, last scan repeated 1500 times", scan_bomb(1500, (2048, 2048)), "image/jpeg",
     "image_too_complex"),
]


def chat(data: bytes, mime: str, **fields) -> dict:
    return {"model": MODEL, "max_tokens": 8, "temperature": 0, **fields, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Here is an image:"}, {"type": "image_url", "image_url": {"url": data_url(data, mime)}},
        {"type": "text", "text": "What colour is it?"}]}]}


def responses_input(data: bytes, mime: str) -> list:
    return [{"role": "user", "content": [{"type": "input_text", "text": "Here is an image:"},
                                         {"type": "input_image", "image_url": data_url(data, mime)},
                                         {"type": "input_text", "text": "What colour is it?"}]}]


def anthropic_messages(data: bytes, mime: str) -> list:
    return [{"role": "user", "content": [{"type": "text", "text": "Here is an image:"}, {"type": "image", "source": {
        "type": "base64", "media_type": mime, "data": base64.b64encode(data).decode()}},
        {"type": "text", "text": "What colour is it?"}]}]


def routes(data: bytes, mime: str) -> list[tuple[str, str, dict]]:
    """(protocol, path, body) of every route that reads an image part, streamed where it streams."""
    return [
        ("openai", "/v1/chat/completions", chat(data, mime)),
        ("openai", "/v1/chat/completions", chat(data, mime, stream=True)),
        ("openai", "/v1/responses", {"model": MODEL, "max_output_tokens": 16, "store": False,
                                     "input": responses_input(data, mime)}),
        ("openai", "/v1/responses", {"model": MODEL, "max_output_tokens": 16, "store": False, "stream": True,
                                     "input": responses_input(data, mime)}),
        ("openai", "/v1/responses/input_tokens", {"model": MODEL, "input": responses_input(data, mime)}),
        ("anthropic", "/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": anthropic_messages(data, mime)}),
        ("anthropic", "/v1/messages", {"model": MODEL, "max_tokens": 8, "stream": True,
                                       "messages": anthropic_messages(data, mime)}),
        ("anthropic", "/v1/messages/count_tokens", {"model": MODEL, "messages": anthropic_messages(data, mime)}),
    ]


@pytest.fixture
def keyed(cluster):
    clients = {key: httpx.Client(base_url=cluster.url, timeout=120, headers={
        "Authorization": f"Bearer {key}", "anthropic-version": "2023-06-01"}) for key in (KEY_A, KEY_B)}
    yield clients
    for c in clients.values():
        c.close()


def test_an_image_pillow_chokes_on_is_a_400_on_every_route(cluster, keyed):
    before = cluster.identities()
    http = keyed[KEY_A]
    for name, data, mime, code in BAD:
        for protocol, path, body in routes(data, mime):
            r = http.post(path, json=body)
            where = (name, path, body.get("stream", False))
            assert r.status_code == 400, (where, r.status_code, r.text[:300])
            error = r.json()["error"]
            if protocol == "anthropic":
                assert r.json()["type"] == "error" and error["type"] == "invalid_request_error", (where, r.text)
                assert "messages[0].content[1]" in error["message"], (where, error)
            else:
                assert error["code"] == code, (where, error)
                assert error["param"] == ("input" if "responses" in path else "messages[0].content[1].image_url"), \
                    (where, error)
    assert http.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "user", "content": "Hi"}]}).status_code == 200
    assert cluster.identities() == before


def test_a_multi_picture_jpeg_is_read_as_its_first_picture(keyed):
    http = keyed[KEY_A]
    photo = mpo((255, 0, 0), (0, 0, 255))  # red first, blue second
    r = http.post("/v1/chat/completions", json=chat(photo, "image/jpeg", max_tokens=12))
    assert r.status_code == 200, r.text
    reply = r.json()["choices"][0]["message"]["content"].lower()
    assert "red" in reply and "blue" not in reply, reply
    for protocol, path, body in routes(photo, "image/jpeg"):
        if path.endswith(("input_tokens", "count_tokens")):
            r = http.post(path, json=body)
            assert r.status_code == 200 and r.json()["input_tokens"] > 0, (path, r.text)


def test_image_bombs_from_one_key_leave_another_keys_plain_request_served(cluster, keyed):
    before = cluster.identities()
    bomb = chat(scan_bomb(1500, (2048, 2048)), "image/jpeg")
    # Legal but slow: near the most scans the server takes, on a picture whose pixels (7 MB) exceed what a
    # handle call carries by value (such a request goes by reference: deployments/models.py).
    heavy = chat(repeat_last_scan(progressive_jpeg((1536, 1536)), 80), "image/jpeg", max_tokens=2)
    plain = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Say hello."}]}
    with ThreadPoolExecutor(8) as pool:
        bombs = [pool.submit(keyed[KEY_A].post, "/v1/chat/completions", json=bomb) for _ in range(4)]
        heavies = [pool.submit(keyed[KEY_A].post, "/v1/chat/completions", json=heavy) for _ in range(2)]
        served = pool.submit(keyed[KEY_B].post, "/v1/chat/completions", json=plain)
        served = served.result()
        assert served.status_code == 200, served.text
        assert served.json()["choices"][0]["message"]["content"] is not None
        for r in (f.result() for f in bombs):
            assert r.status_code == 400 and r.json()["error"]["code"] == "image_too_complex", r.text
        for r in (f.result() for f in heavies):
            assert r.status_code == 200, r.text
    assert cluster.identities() == before
