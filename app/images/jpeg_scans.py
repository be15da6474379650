"""How many scans a JPEG's first image has, read from its markers before any pixel is decoded.

A progressive JPEG refines its pixels over several scans (libjpeg writes 10), and each scan walks every
block of the image however few bytes it takes: a small file whose last scan repeats thousands of times
decodes for minutes. libjpeg has no scan limit of its own, so the scans are counted here (SOS markers up
to the first EOI: an MPO's first frame, the one decoded) and a file with too many is refused."""

from __future__ import annotations

import re

# A marker: 0xFF (fill bytes allowed) then a code. Inside a scan's entropy-coded data a 0xFF byte is
# always stuffed as FF 00, so only real markers (and RSTn) match.
_MARKER = re.compile(rb"\xff+([^\x00\xff])")
_SOS, _EOI, _TEM = 0xDA, 0xD9, 0x01


def jpeg_scans(data: bytes) -> int:
    """The SOS markers of the first image in `data` (a JPEG, from its SOI). Segments are skipped by their
    declared length, as libjpeg skips them, so bytes inside an APPn (an EXIF thumbnail) are not counted."""
    scans, i, n = 0, 2, len(data)
    while True:
        marker = _MARKER.search(data, i)
        if marker is None:
            return scans
        code, i = marker[1][0], marker.end()
        if code == _EOI:
            return scans
        if 0xD0 <= code <= 0xD7 or code == _TEM:
            continue  # RSTn and TEM stand alone: no length
        if code == _SOS:
            scans += 1
        if i + 2 > n:
            return scans
        i += max(2, int.from_bytes(data[i:i + 2], "big"))  # the length counts its own two bytes
