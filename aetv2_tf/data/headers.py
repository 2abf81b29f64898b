"""Image headers: the size, depth and coding an image file declares, read before it is decoded.

`files.check_image_file` calls `header_problem` on every file of a folder when the folder is
listed, so that an image TensorFlow cannot decode, or one that would take gigabytes to decode
(a "decompression bomb": a 389 KB PNG can declare 30000 x 30000 pixels, 2.7 GB as RGB), is
named and left out of the list instead of killing the run at its first batch with a traceback.

What is read, per format (files are read forward in chunks of 8 to 64 KiB, `_Reader`: one
chunk in memory whatever the file's size; a segment or sub-block is skipped by its length, a
seek, not a read):

* JPEG: the markers from the start of the file to the first frame header (SOFn), whose
  precision, height, width and component count are read (ITU T.81 B.1.1.2: any number of
  ``FF`` fill bytes may precede a marker; ``FF 00`` and other bytes between segments are not
  markers and are skipped, as libjpeg does with a warning, up to 64 KiB in all; SOI, RSTn and
  TEM have no length; a segment that runs past the end of the file is "truncated").
  TensorFlow's libjpeg-turbo decodes 8-bit Huffman baseline, extended and progressive frames
  (SOF0, SOF1, SOF2) and their arithmetic-coded forms (SOF9, SOF10) with 1, 3 or 4 components;
  everything else is refused: 12-bit precision ("Unsupported JPEG data precision 12"), lossless
  (SOF3, SOF11) and hierarchical (SOF5-7, SOF13-15) frames ("Unsupported JPEG process"), a
  height of 0 (set later by a DNL marker), a scan before any frame header.
* PNG: the IHDR chunk (it must come first, with a valid CRC): width, height, bit depth and
  colour type, which must be a combination the PNG standard allows.
* GIF: every block of the file, to its trailer (``3B``): the logical screen descriptor and its
  colour table, extensions (``21``: label, data sub-blocks to a 0-length one) and image
  descriptors (``2C``: left, top, width, height, flags, local colour table, LZW code size, data
  sub-blocks). TensorFlow sizes its output by the largest frame width and height, not by the
  screen (a 1 x 1 frame at (2, 2) of a 4 x 4 screen decodes to 1 x 1), and giflib
  loads every frame (one byte per pixel) even when only the first is kept, so the limits are:
  the screen and every frame's extent (``left + width`` x ``top + height``) at most
  `MAX_IMAGE_PIXELS`, at most `MAX_GIF_FRAMES` frames, and their areas at most
  `MAX_GIF_FRAME_PIXELS` in all. A file that ends before its trailer is "truncated", and one
  with an unknown block is damaged: both are refused (TensorFlow fails on a GIF cut in its first
  frame, and decodes the frames before a cut or a damaged block, logging "failed to slurp gif
  file"), and so is a GIF without any frame. The whole file is read: one pass over it.
* BMP: the file header's pixel offset and the info header's width, height (negative: stored
  top-down), bits per pixel and compression. TensorFlow's decoder reads only those offsets,
  assumes a BITMAPINFOHEADER layout and uncompressed rows, and takes bits / 8 channels, so it
  accepts a 40-byte or larger info header, 8, 24 or 32 bits per pixel, and compression 0
  (BI_RGB) or, with 32 bits, 3 (BI_BITFIELDS, read as BGRA: the masks are not checked); an
  OS/2 core header (12 bytes: 16-bit sizes) fails it, and RLE (1, 2), JPEG (4) or PNG (5)
  compressed rows "decode" as noise when the file is long enough, so all are refused. The file
  must hold ``bfOffBits + row_bytes * |height|`` bytes (rows padded to 4 bytes), as TensorFlow
  requires ("Input size should be at least ...").

Every format: width and height >= 1 and at most `MAX_IMAGE_PIXELS` pixels.
"""

from __future__ import annotations

import os
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

MAX_GIF_FRAMES = 1000
"""The most frames a GIF may hold (an animated GIF of a photo dataset has at most a few hundred;
a crafted one could hold millions of tiny frames, each read by giflib)."""

MAX_GIF_FRAME_PIXELS = 3 * MAX_IMAGE_PIXELS
"""The most pixels all the frames of a GIF may declare together (268 M): giflib keeps every
frame at one byte per pixel while TensorFlow decodes the first, so a GIF's frames may cost as
much as the largest image allowed does decoded as RGB (268 MB). A crafted GIF of 1,000 frames of
9000 x 9000 pixels, whose LZW data compresses to a few MB, would otherwise ask for 81 GB."""

_CHUNK = 1 << 16  # the most bytes `_Reader` reads at once
_FIRST_CHUNK = 1 << 13  # its first read: a JPEG's frame header is in its first few KB
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
_BMP_COMPRESSION = {1: "RLE8", 2: "RLE4", 4: "JPEG", 5: "PNG", 6: "alpha bit fields",
                    11: "CMYK", 12: "CMYK RLE8", 13: "CMYK RLE4"}


def _size_problem(width: int, height: int, what: str) -> str | None:
    """Why a declared ``width`` x ``height`` is refused (`MAX_IMAGE_PIXELS`), or None."""
    if width < 1 or height < 1:
        return f"{what} declares {width} x {height} pixels"
    if width * height > MAX_IMAGE_PIXELS:
        return (f"{what} declares {width} x {height} = {width * height:,} pixels, over the "
                f"limit of {MAX_IMAGE_PIXELS:,} (aetv2_tf.data.headers.MAX_IMAGE_PIXELS: a "
                "decompression bomb or a huge scan; downscale it to use it)")
    return None


class _Reader:
    """A file read forward from byte ``start`` in chunks of 8 KiB, doubling to `_CHUNK` (64 KiB):
    one chunk in memory whatever the file's size, no more read than a JPEG's header needs (the
    old walker's 8 KiB buffer); a skip past the chunk is a seek, not a read."""

    def __init__(self, f: BinaryIO, start: int) -> None:
        self.size = f.seek(0, os.SEEK_END)
        self._f, self._buf, self._base, self._pos = f, b"", start, 0
        self._chunk = _FIRST_CHUNK

    @property
    def offset(self) -> int:
        """The file offset of the next byte read (past ``size`` after a skip past the end)."""
        return self._base + self._pos

    def read(self, n: int) -> bytes:
        """The next ``n`` bytes; fewer at the end of the file."""
        if self._pos + n > len(self._buf):
            self._base += self._pos
            self._f.seek(self._base)
            self._buf, self._pos = self._f.read(max(n, self._chunk)), 0
            self._chunk = min(2 * self._chunk, _CHUNK)
        out = self._buf[self._pos:self._pos + n]
        self._pos += len(out)
        return out

    def byte(self) -> int | None:
        """The next byte, or None at the end of the file."""
        if self._pos < len(self._buf):
            self._pos += 1
            return self._buf[self._pos - 1]
        got = self.read(1)
        return got[0] if got else None

    def skip(self, n: int) -> None:
        self._pos += n


def _jpeg_marker(r: _Reader) -> int | str:
    """The code of the next JPEG marker (T.81 B.1.1.2: ``FF`` fill bytes before it skipped;
    ``FF 00`` and other bytes, which libjpeg skips as "extraneous", skipped up to
    `_JPEG_MAX_GARBAGE` in all), or why there is none."""
    skipped, previous = 0, None
    while skipped <= _JPEG_MAX_GARBAGE:
        byte = r.byte()
        if byte is None:
            return "truncated JPEG (no frame header)"
        if previous == 0xFF and byte not in (0x00, 0xFF):  # FF 00: a stuffed zero, FF FF: fill
            return byte
        previous, skipped = byte, skipped + 1
    return (f"JPEG with over {_JPEG_MAX_GARBAGE:,} bytes that are not markers between two "
            "segments before its frame header (damaged); re-encode it")


def _jpeg_problem(f: BinaryIO) -> str | None:
    """Walks the markers of the JPEG ``f`` from after its SOI to its first frame header."""
    r = _Reader(f, 2)
    for _ in range(_JPEG_MAX_SEGMENTS):
        code = _jpeg_marker(r)
        if isinstance(code, str):
            return code
        if code in _JPEG_NO_LENGTH:
            continue
        if code == 0xD9 or code == 0xDA:
            return "JPEG without a frame header (SOFn) before its " + \
                ("end" if code == 0xD9 else "first scan")
        raw = r.read(2)
        if len(raw) < 2:
            return "truncated JPEG (no frame header)"
        length = struct.unpack(">H", raw)[0]
        if length < 2:
            return f"JPEG segment FF{code:02X} with an impossible length {length}"
        if r.offset + length - 2 > r.size:
            return (f"truncated JPEG (segment FF{code:02X} of {length:,} bytes at byte "
                    f"{r.offset - 4:,} runs past the end of the file, {r.size:,} bytes)")
        if code in _JPEG_UNDECODABLE:
            return (f"{_JPEG_UNDECODABLE[code]} JPEG (SOF{code - 0xC0}), which TensorFlow "
                    "cannot decode; convert it to a baseline JPEG or a PNG")
        if code in _JPEG_DECODABLE:
            frame = r.read(6)
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
        r.skip(length - 2)
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


def _gif_sub_blocks(r: _Reader) -> bool:
    """Skips data sub-blocks (a length byte, then that many bytes) to the 0-length one; False if
    the file ends first."""
    while True:
        length = r.byte()
        if not length:
            return length == 0
        r.skip(length)


def _gif_problem(f: BinaryIO, head: bytes) -> str | None:
    """Walks every block of the GIF ``f`` (its first bytes ``head``) to its trailer."""
    if len(head) < 13:
        return "truncated GIF (no screen descriptor)"
    width, height, flags = struct.unpack("<HHB", head[6:11])
    problem = _size_problem(width, height, "GIF")
    if problem:
        return problem
    r = _Reader(f, 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0))
    frames = area = 0
    while True:
        block = r.byte()
        if block == 0x3B:  # trailer
            return None if frames else "GIF without any frame; remove it"
        if block == 0x21:  # extension: label, sub-blocks
            if r.byte() is None or not _gif_sub_blocks(r):
                break
        elif block == 0x2C:  # image descriptor
            descriptor = r.read(9)
            if len(descriptor) < 9:
                break
            left, top, w, h, flags = struct.unpack("<HHHHB", descriptor)
            frames, area = frames + 1, area + w * h
            problem = _size_problem(max(width, left + w), max(height, top + h),
                                    f"GIF frame {frames} ({w} x {h} at {left}, {top})")
            if problem:
                return problem
            if frames > MAX_GIF_FRAMES:
                return (f"GIF with over {MAX_GIF_FRAMES:,} frames (aetv2_tf.data.headers."
                        "MAX_GIF_FRAMES: giflib reads every frame to decode the first); save "
                        "its first frame as a PNG to use it")
            if area > MAX_GIF_FRAME_PIXELS:
                return (f"GIF whose {frames} frames declare {area:,} pixels in all, over the "
                        f"limit of {MAX_GIF_FRAME_PIXELS:,} (aetv2_tf.data.headers."
                        "MAX_GIF_FRAME_PIXELS: giflib keeps every frame to decode the first); "
                        "save its first frame as a PNG to use it")
            r.skip(3 << ((flags & 7) + 1) if flags & 0x80 else 0)  # local colour table
            if r.byte() is None or not _gif_sub_blocks(r):  # LZW code size, image data
                break
        elif block is None:
            break
        else:
            return (f"GIF with an unknown block {block:#04x} at byte {r.offset - 1:,} "
                    "(damaged), which TensorFlow cannot decode; re-save it")
    return (f"truncated GIF (it ends at byte {r.size:,}, before its trailer, after {frames} "
            "frame(s)); download or copy it again")


def _bmp_problem(f: BinaryIO, head: bytes) -> str | None:
    """Reads the file and info headers of a BMP's first 34 bytes ``head``; ``f`` for its size."""
    if len(head) < 34:
        return "truncated BMP (no info header)"
    offset, info = struct.unpack("<II", head[10:18])
    if info == 12:
        return ("BMP with an OS/2 core header (BITMAPCOREHEADER, 12 bytes), which TensorFlow "
                "cannot decode; re-save it as a Windows BMP or a PNG")
    if info < 40:
        return f"BMP with an unknown info header of {info} bytes"
    width, height, _, bits, compression = struct.unpack("<iiHHI", head[18:34])
    if bits not in _BMP_BITS:
        return f"{bits}-bit BMP, which TensorFlow cannot decode (8, 24 or 32 bits per pixel)"
    if compression not in (0, 3) or (compression == 3 and bits != 32):
        name = _BMP_COMPRESSION.get(compression, "bit fields" if compression == 3 else
                                    f"unknown ({compression})")
        return (f"BMP with {name} compression (at {bits} bits), which TensorFlow cannot decode "
                "(it reads uncompressed rows); re-save it uncompressed or as a PNG")
    problem = _size_problem(width, abs(height), "BMP")  # negative height: stored top-down
    if problem:
        return problem
    needed = offset + (bits * width + 31) // 32 * 4 * abs(height)
    size = f.seek(0, os.SEEK_END)
    if size < needed:
        return (f"truncated BMP ({size:,} bytes; its header declares {needed:,}: pixels from "
                f"byte {offset:,}, {abs(height)} rows of {width} pixels); download or copy it "
                "again")
    return None


def header_problem(f: BinaryIO, kind: str, head: bytes) -> str | None:
    """Why the image in ``f`` (an open binary file of format ``kind``, "jpeg", "png", "gif" or
    "bmp", whose first bytes are ``head``, at least 34 of them when the file has that many)
    cannot or should not be decoded, from its headers alone (module docstring); None if it can.
    May move the file position."""
    if kind == "jpeg":
        return _jpeg_problem(f)
    if kind == "png":
        return _png_problem(head)
    if kind == "gif":
        return _gif_problem(f, head)
    if kind == "bmp":
        return _bmp_problem(f, head)
    return None
