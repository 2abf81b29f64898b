"""Image headers: the size, depth and coding an image file declares, read before it is decoded.

`files.check_image_file` calls `header_problem` on every file of a folder when the folder is
listed, so that an image TensorFlow cannot decode, or one that would take gigabytes to decode
(a "decompression bomb": a 389 KB PNG can declare 30000 x 30000 pixels, 2.7 GB as RGB), is
named and left out of the list instead of killing the run at its first batch with a traceback.

What is read, per format (a few hundred bytes; a JPEG's markers are skipped by their lengths):

* JPEG: the markers from the start of the file to the first frame header (SOFn), whose
  precision, height, width and component count are read. TensorFlow's libjpeg-turbo decodes
  8-bit Huffman baseline, extended and progressive frames (SOF0, SOF1, SOF2) and their
  arithmetic-coded forms (SOF9, SOF10) with 1, 3 or 4 components; everything else is refused:
  12-bit precision ("Unsupported JPEG data precision 12"), lossless (SOF3, SOF11) and
  hierarchical (SOF5-7, SOF13-15) frames ("Unsupported JPEG process"), a height of 0 (set later
  by a DNL marker), a scan before any frame header.
* PNG: the IHDR chunk (it must come first, with a valid CRC): width, height, bit depth and
  colour type, which must be a combination the PNG standard allows.
* GIF: the logical screen width and height.
* BMP: the info header's width, height (negative: stored top-down) and bits per pixel, which
  must be 8, 24 or 32 (TensorFlow refuses 1, 4 and 16).

Every format: width and height >= 1 and at most `MAX_IMAGE_PIXELS` pixels.
"""

from __future__ import annotations

import struct
import zlib
from typing import BinaryIO

MAX_IMAGE_PIXELS = 89_478_485
"""The most pixels (width x height) an image file may declare; larger files are left out.

Pillow's default (``PIL.Image.MAX_IMAGE_PIXELS``, a 1 GiB RGBA buffer: about 9459 x 9459). A
decode of an image at the limit takes 268 MB as uint8 RGB (537 MB for a 16-bit PNG before its
conversion) and the resize of its crop window about as much again in float32, so about 1 GB per
image being decoded: tf.data decodes as many at once as the machine has cores (AUTOTUNE), so a
24 GB machine with 16 cores survives a folder made only of such images. Photo datasets are far
below it (ImageNet's images are about 0.2 M pixels on average; a 48-megapixel phone photo,
8000 x 6000, passes). The decoded batches themselves are crops (224 x 224): their size does not
depend on the files'."""

_JPEG_DECODABLE = {0xC0: "baseline", 0xC1: "extended", 0xC2: "progressive",
                   0xC9: "arithmetic extended", 0xCA: "arithmetic progressive"}
_JPEG_UNDECODABLE = {0xC3: "lossless", 0xC5: "hierarchical", 0xC6: "hierarchical progressive",
                     0xC7: "hierarchical lossless", 0xCB: "arithmetic lossless",
                     0xCD: "arithmetic hierarchical", 0xCE: "arithmetic hierarchical progressive",
                     0xCF: "arithmetic hierarchical lossless"}
_JPEG_NO_LENGTH = {0x01, *range(0xD0, 0xD9)}  # TEM, RST0-7, SOI: markers without a segment
_JPEG_MAX_SEGMENTS = 1000  # a frame header comes after a handful of APPn / DQT / DHT segments
_JPEG_MAX_GARBAGE = 65536  # bytes between segments ("extraneous bytes before marker")
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
_BMP_BITS = (8, 24, 32)


def _size_problem(width: int, height: int, what: str) -> str | None:
    """Why a declared ``width`` x ``height`` is refused (`MAX_IMAGE_PIXELS`), or None."""
    if width < 1 or height < 1:
        return f"{what} declares {width} x {height} pixels"
    if width * height > MAX_IMAGE_PIXELS:
        return (f"{what} declares {width} x {height} = {width * height:,} pixels, over the "
                f"limit of {MAX_IMAGE_PIXELS:,} (aetv2_tf.data.headers.MAX_IMAGE_PIXELS: a "
                "decompression bomb or a huge scan; downscale it to use it)")
    return None


def _jpeg_problem(f: BinaryIO) -> str | None:
    """Walks the markers of the JPEG ``f`` (positioned anywhere) to its first frame header."""
    f.seek(2)  # after SOI
    for _ in range(_JPEG_MAX_SEGMENTS):
        byte, skipped = f.read(1), 0
        while byte and byte != b"\xff" and skipped < _JPEG_MAX_GARBAGE:  # libjpeg skips it too
            byte, skipped = f.read(1), skipped + 1
        if byte != b"\xff":
            return "JPEG markers broken before the frame header" if byte else \
                "truncated JPEG (no frame header)"
        marker = b"\xff"
        while marker == b"\xff":  # fill bytes
            marker = f.read(1)
        if not marker:
            return "truncated JPEG (no frame header)"
        code = marker[0]
        if code in _JPEG_NO_LENGTH:
            continue
        if code == 0xD9 or code == 0xDA:
            return "JPEG without a frame header (SOFn) before its " + \
                ("end" if code == 0xD9 else "first scan")
        raw = f.read(2)
        if len(raw) < 2:
            return "truncated JPEG (no frame header)"
        length = struct.unpack(">H", raw)[0]
        if length < 2:
            return f"JPEG segment FF{code:02X} with an impossible length {length}"
        if code in _JPEG_UNDECODABLE:
            return (f"{_JPEG_UNDECODABLE[code]} JPEG (SOF{code - 0xC0}), which TensorFlow "
                    "cannot decode; convert it to a baseline JPEG or a PNG")
        if code in _JPEG_DECODABLE:
            frame = f.read(6)
            if len(frame) < 6 or length < 8:
                return "truncated JPEG (frame header cut short)"
            precision, height, width, components = struct.unpack(">BHHB", frame)
            if precision != 8:
                return (f"{precision}-bit JPEG, which TensorFlow cannot decode (8-bit only); "
                        "convert it to an 8-bit JPEG or a 16-bit PNG")
            if height == 0:
                return "JPEG whose height is set by a DNL marker, which TensorFlow cannot decode"
            if components not in (1, 3, 4):
                return f"JPEG with {components} colour components (1, 3 or 4 decode)"
            return _size_problem(width, height, "JPEG")
        f.seek(length - 2, 1)
    return f"JPEG with over {_JPEG_MAX_SEGMENTS} segments before its frame header"


def _png_problem(head: bytes) -> str | None:
    """Reads the IHDR chunk of a PNG's first 33 bytes ``head``."""
    if len(head) < 33 or head[12:16] != b"IHDR":
        return "PNG without an IHDR chunk first"
    (length,) = struct.unpack(">I", head[8:12])
    width, height, depth, colour = struct.unpack(">IIBB", head[16:26])
    if length != 13 or struct.unpack(">I", head[29:33])[0] != zlib.crc32(head[12:29]):
        return "PNG whose IHDR chunk is damaged (length or CRC)"
    if depth not in _PNG_DEPTHS.get(colour, ()):
        return f"PNG with bit depth {depth} and colour type {colour}, not a valid combination"
    return _size_problem(width, height, "PNG")


def _bmp_problem(head: bytes) -> str | None:
    """Reads the info header of a BMP's first 30 bytes ``head``."""
    if len(head) < 26:
        return "truncated BMP (no info header)"
    (info,) = struct.unpack("<I", head[14:18])
    if info == 12:  # BITMAPCOREHEADER (OS/2): unsigned 16-bit sizes
        width, height, _, bits = struct.unpack("<HHHH", head[18:26])
    elif info >= 40 and len(head) >= 30:
        width, height, _, bits = struct.unpack("<iiHH", head[18:30])
        height = abs(height)  # negative: rows stored top-down
    else:
        return f"BMP with an unknown info header of {info} bytes"
    if bits not in _BMP_BITS:
        return f"{bits}-bit BMP, which TensorFlow cannot decode (8, 24 or 32 bits per pixel)"
    return _size_problem(width, height, "BMP")


def header_problem(f: BinaryIO, kind: str, head: bytes) -> str | None:
    """Why the image in ``f`` (an open binary file of format ``kind``, "jpeg", "png", "gif" or
    "bmp", whose first bytes are ``head``, at least 33 of them when the file has that many)
    cannot or should not be decoded, from its header alone (module docstring); None if it can.
    May move the file position."""
    if kind == "jpeg":
        return _jpeg_problem(f)
    if kind == "png":
        return _png_problem(head)
    if kind == "gif":
        if len(head) < 10:
            return "truncated GIF (no screen descriptor)"
        return _size_problem(*struct.unpack("<HH", head[6:10]), "GIF")
    if kind == "bmp":
        return _bmp_problem(head)
    return None
