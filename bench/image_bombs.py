"""Image bombs for python -m bench.hostile: small files that decode for long (made with Pillow here, so the
bench needs no test helpers).

A progressive JPEG of the largest picture side the server scales to (2048) with its last scan repeated:
about 60 kB that libjpeg decodes scan by scan, each scan walking every block (seconds of one core per
image on this machine, unless refused by its scan count before decoding: limits.max_jpeg_scans)."""

from __future__ import annotations

import base64
import io

from PIL import Image


def scan_bomb(times: int = 1500, side: int = 2048) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (side, side), (200, 30, 30)).save(buf, "JPEG", progressive=True, quality=90)
    jpeg = buf.getvalue()
    last, end = jpeg.rindex(b"\xff\xda"), jpeg.rindex(b"\xff\xd9")
    return jpeg[:end] + jpeg[last:end] * times + jpeg[end:]


def scan_bomb_url(times: int = 1500, side: int = 2048) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(scan_bomb(times, side)).decode("ascii")
