"""Image headers: what an image file declares, read by Pillow before anything is decoded, and
what the two decoders of the training input could not decode alike.

`image_folders.check_image_file` calls `header_problem` on every file of a folder when the folder
is listed, so that a file one decoder cannot read, one the two decoders would read differently
(TensorFlow's, `augment.decode_rgb`, under TensorFlow; Pillow's, `stream.rgb_image`, under JAX),
or one that would take gigabytes to decode (a "decompression bomb": a 389 KB PNG can declare
30000 x 30000 pixels, 2.7 GB as RGB) is named and left out of the list instead of killing the run
at its first batch, or training on other pixels on the other backend.

Pillow's plugin for the file's format opens it lazily: it reads the headers (a JPEG's markers to
its first scan, a PNG's chunks to its image data with their CRCs, a GIF's screen and first
frame, a BMP's file and info headers and palette), never the pixels; what it cannot read is
refused in its words. Then, per format, what TensorFlow's decoders do not do as Pillow does:

* JPEG: TensorFlow's libjpeg-turbo decodes 8-bit Huffman baseline, extended and progressive
  frames (SOF0, SOF1, SOF2) and their arithmetic-coded forms (SOF9, SOF10); lossless (SOF3,
  SOF11) and hierarchical (SOF5-7, SOF13-15) frames fail it ("Unsupported JPEG process"), so
  they are refused (Pillow refuses 12-bit precision, a height set by a DNL marker, markers it
  does not know). The frame's marker is found before the first scan, at the frame header Pillow
  read (its precision, size and components).
* GIF: every block of the file, to its trailer (``3B``), is walked (`_gif_problem`): TensorFlow
  (giflib) loads every frame, one byte a pixel, to keep the first, so a GIF is refused with more
  than `MAX_GIF_FRAMES` frames or `MAX_GIF_FRAME_PIXELS` frame pixels in all, a cut before its
  trailer ("truncated"), an unknown block (damaged: TensorFlow decodes the frames before it,
  logging an error), a frame outside the screen or a first frame that does not cover it
  (TensorFlow sizes its output by the frames, Pillow by the screen).
* BMP: TensorFlow reads the offsets of a BITMAPINFOHEADER (40 bytes or more: an OS/2 header of
  12 fails it), uncompressed rows of 8, 24 or 32 bits (compression 0, or 3 at 32 bits read as
  BGRA: other masks, RLE, JPEG or PNG rows "decode" as other colours or noise), takes an 8-bit
  image's indices as grey levels (a palette that is not the grey ramp would differ from
  Pillow's colours) and needs ``offset + row_bytes * |height|`` bytes.
* PNG: Pillow's checks (IHDR first, its CRC, a valid depth and colour type) are TensorFlow's.

Every format: width and height >= 1 and at most `MAX_IMAGE_PIXELS` pixels.
"""

from __future__ import annotations

import os
import re
import struct
import warnings
import zlib
from typing import BinaryIO

from PIL import BmpImagePlugin, GifImagePlugin, Image, JpegImagePlugin, PngImagePlugin

MAX_IMAGE_PIXELS = 89_478_485
"""The most pixels (width x height) an image file may declare; larger files are left out.

Pillow's default decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``, a 1 GiB RGBA
buffer: about 9459 x 9459). A decode of an image at the limit takes 268 MB as uint8 RGB (537 MB
for a 16-bit PNG before its conversion) and the resize of its crop window about as much again in
float32, so about 1 GB per image being decoded: tf.data decodes as many at once as the machine
has cores (AUTOTUNE), so a 24 GB machine with 16 cores survives a folder made only of such
images. Photo datasets are far below it (ImageNet's images are about 0.2 M pixels on average; a
48-megapixel phone photo, 8000 x 6000, passes). The decoded batches themselves are crops (224 x
224): their size does not depend on the files'."""

MAX_GIF_FRAMES = 1000
"""The most frames a GIF may hold (an animated GIF of a photo dataset has at most a few hundred;
a crafted one could hold millions of tiny frames, each read by giflib)."""

MAX_GIF_FRAME_PIXELS = 3 * MAX_IMAGE_PIXELS
"""The most pixels all the frames of a GIF may declare together (268 M): giflib keeps every
frame at one byte per pixel while TensorFlow decodes the first, so a GIF's frames may cost as
much as the largest image allowed does decoded as RGB (268 MB). A crafted GIF of 1,000 frames of
9000 x 9000 pixels, whose LZW data compresses to a few MB, would otherwise ask for 81 GB."""

_PLUGINS = {"jpeg": JpegImagePlugin.JpegImageFile, "png": PngImagePlugin.PngImageFile,
            "gif": GifImagePlugin.GifImageFile, "bmp": BmpImagePlugin.BmpImageFile}
_JPEG_UNDECODABLE = {0xC3: "lossless", 0xC5: "hierarchical", 0xC6: "hierarchical progressive",
                     0xC7: "hierarchical lossless", 0xCB: "arithmetic lossless",
                     0xCD: "arithmetic hierarchical", 0xCE: "arithmetic hierarchical progressive",
                     0xCF: "arithmetic hierarchical lossless"}
_BMP_RAW_MODES = {8: ("L",), 24: ("BGR",), 32: ("BGRX", "BGRA")}  # Pillow's reading as TF's
_BMP_COMPRESSION = {0: "no", 1: "RLE8", 2: "RLE4", 3: "bit fields", 4: "JPEG", 5: "PNG"}


def header_problem(f: BinaryIO, kind: str, head: bytes) -> str | None:
    """Why the image in ``f`` (an open binary file of format ``kind``, "jpeg", "png", "gif" or
    "bmp", whose first bytes are ``head``, at least 34 of them when the file has that many)
    should not be decoded, from its headers alone (module docstring); None if it can be. An
    OSError of the disk (one with an errno) is raised, not reported. Moves the file position."""
    f.seek(0)
    bomb = (f"over the limit of {MAX_IMAGE_PIXELS:,} pixels (aetv2_tf.data.headers."
            "MAX_IMAGE_PIXELS: a decompression bomb or a huge scan; downscale it to use it)")
    try:
        with warnings.catch_warnings():  # the size is judged below, against our limit
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = _PLUGINS[kind](f)
    except Image.DecompressionBombError as e:
        return f"{kind.upper()} {bomb} ({e})"
    except (SyntaxError, ValueError, OSError) as e:
        if isinstance(e, OSError) and e.errno is not None:
            raise
        return (f"{kind.upper()} whose headers Pillow cannot read ({e}): damaged, truncated or "
                "a coding the decoders do not share; re-save it as a baseline JPEG or a PNG")
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        return f"{kind.upper()} declares {width} x {height} = {width * height:,} pixels, {bomb}"
    if kind == "jpeg":
        return _jpeg_problem(f, image)
    if kind == "gif":
        return _gif_problem(f, head) or _gif_colour_problem(image, head)
    if kind == "bmp":
        return _bmp_problem(f, head, image)
    return _png_problem(f)


def _png_problem(f: BinaryIO) -> str | None:
    """A PNG whose chunks fail their CRC or whose image data (IDAT) is no whole zlib stream:
    TensorFlow's decoder fails on it mid-run ("Invalid PNG data"). Reads the file once, in
    chunks; the data is inflated 1 MiB at a time and dropped."""
    f.seek(8)
    inflate = zlib.decompressobj()
    while len(header := f.read(8)) == 8:
        length, kind = struct.unpack(">I4s", header)
        data, crc = f.read(length), f.read(4)
        if len(crc) < 4 or zlib.crc32(kind + data) != struct.unpack(">I", crc)[0]:
            return f"damaged PNG (its {kind!r} chunk fails its CRC): re-save or remove it"
        while kind == b"IDAT" and data and not inflate.eof:
            try:
                inflate.decompress(data, 2**20)
            except zlib.error as e:
                return f"damaged PNG (its image data does not inflate: {e}): re-save or remove it"
            data = inflate.unconsumed_tail
        if kind == b"IEND":
            return None if inflate.eof else "damaged PNG (its image data ends early)"
    return "truncated PNG (no IEND chunk)"


def _jpeg_problem(f: BinaryIO, image: JpegImagePlugin.JpegImageFile) -> str | None:
    """The coding of the frame Pillow read (its header's marker, found before the first scan,
    where Pillow stopped: the last ``FF Cn`` followed by that frame's length, precision, size
    and components; an EXIF thumbnail's frame comes earlier)."""
    before_scan = f.tell()
    f.seek(0)
    width, height = image.size
    frame = struct.pack(">HBHHB", 8 + 3 * image.layers, image.bits, height, width, image.layers)
    codes = re.findall(rb"\xff([\xc0-\xcf])" + re.escape(frame), f.read(before_scan))
    code = codes[-1][0] if codes else None
    if code in _JPEG_UNDECODABLE:
        return (f"{_JPEG_UNDECODABLE[code]} JPEG (SOF{code - 0xC0}), which TensorFlow cannot "
                "decode; convert it to a baseline JPEG or a PNG")
    return None


def _gif_problem(f: BinaryIO, head: bytes) -> str | None:
    """Walks every block of the GIF ``f`` (its first bytes ``head``) to its trailer (module
    docstring)."""
    screen_width, screen_height, flags = struct.unpack("<HHB", head[6:11])
    f.seek(13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0))
    frames = area = 0
    while True:
        block = f.read(1)
        if block == b"\x3b":  # trailer
            return None if frames else "GIF without any frame; remove it"
        if block == b"\x21":  # extension: label, sub-blocks
            if not f.read(1) or not _skip_sub_blocks(f):
                break
        elif block == b"\x2c":  # image descriptor
            descriptor = f.read(9)
            if len(descriptor) < 9:
                break
            left, top, width, height, flags = struct.unpack("<HHHHB", descriptor)
            frames, area = frames + 1, area + width * height
            where = f"GIF frame {frames} ({width} x {height} at {left}, {top})"
            if left + width > screen_width or top + height > screen_height:
                return f"{where} lies outside its {screen_width} x {screen_height} screen"
            if frames == 1 and (width, height) != (screen_width, screen_height):
                return (f"{where} does not cover its {screen_width} x {screen_height} screen: "
                        "TensorFlow decodes the frame, Pillow the screen; save it as a PNG")
            if frames > MAX_GIF_FRAMES:
                return (f"GIF with over {MAX_GIF_FRAMES:,} frames (aetv2_tf.data.headers."
                        "MAX_GIF_FRAMES: giflib reads every frame to decode the first); save "
                        "its first frame as a PNG to use it")
            if area > MAX_GIF_FRAME_PIXELS:
                return (f"GIF whose {frames} frames declare {area:,} pixels in all, over the "
                        f"limit of {MAX_GIF_FRAME_PIXELS:,} (aetv2_tf.data.headers."
                        "MAX_GIF_FRAME_PIXELS: giflib keeps every frame to decode the first); "
                        "save its first frame as a PNG to use it")
            f.seek(3 << ((flags & 7) + 1) if flags & 0x80 else 0, os.SEEK_CUR)  # colour table
            if not f.read(1) or not _skip_sub_blocks(f):  # LZW code size, image data
                break
        elif not block:
            break
        else:
            return (f"GIF with an unknown block {block[0]:#04x} at byte {f.tell() - 1:,} "
                    "(damaged), which TensorFlow cannot decode; re-save it")
    return (f"truncated GIF (it ends at byte {f.seek(0, os.SEEK_END):,}, before its trailer, "
            f"after {frames} frame(s)); download or copy it again")


def _gif_colour_problem(image: GifImagePlugin.GifImageFile, head: bytes) -> str | None:
    """A first frame whose pixels index past its colour table (giflib refuses them; Pillow
    does not): its indices decoded by Pillow (within the pixel limits checked before)."""
    import numpy as np

    image.seek(0)
    f = image.fp
    f.seek(13 + (3 << ((head[10] & 7) + 1) if head[10] & 0x80 else 0))
    colours = 2 << (head[10] & 7) if head[10] & 0x80 else 0
    while (block := f.read(1)) == b"\x21":  # extensions before the first frame
        f.read(1)
        _skip_sub_blocks(f)
    flags = f.read(9)[8]
    colours = 2 << (flags & 7) if flags & 0x80 else colours
    try:
        image.seek(0)
        indices = np.asarray(image.convert("P") if image.mode != "P" else image)
    except (OSError, ValueError, SyntaxError) as e:
        return f"damaged GIF (its first frame does not decode: {e}); re-save it as a PNG"
    if block == b"\x2c" and indices.size and int(indices.max()) >= colours:
        return (f"damaged GIF (its first frame uses colour {int(indices.max())} of a table of "
                f"{colours}); re-save it as a PNG")
    return None


def _skip_sub_blocks(f: BinaryIO) -> bool:
    """Skips data sub-blocks (a length byte, then that many bytes) to the 0-length one; False
    if the file ends first."""
    while True:
        length = f.read(1)
        if not length:
            return False
        if length == b"\0":
            return True
        f.seek(length[0], os.SEEK_CUR)


def _bmp_problem(f: BinaryIO, head: bytes, image: BmpImagePlugin.BmpImageFile) -> str | None:
    """TensorFlow's BMP decoder against the headers Pillow read (module docstring)."""
    (info,) = struct.unpack("<I", head[14:18])
    if info < 40:
        return (f"BMP with an OS/2 or other {info}-byte header, which TensorFlow cannot decode; "
                "re-save it as a Windows BMP or a PNG")
    bits, compression = struct.unpack("<HI", head[28:34])
    raw_mode, stride = image.tile[0].args[:2]
    if bits not in _BMP_RAW_MODES:
        return f"{bits}-bit BMP, which TensorFlow cannot decode (8, 24 or 32 bits per pixel)"
    if compression not in (0, 3) or (compression == 3 and raw_mode not in ("BGRX", "BGRA")):
        name = _BMP_COMPRESSION.get(compression, f"unknown ({compression})")
        return (f"BMP with {name} compression (at {bits} bits, read as {raw_mode}), which "
                "TensorFlow reads as uncompressed BGR(A) rows; re-save it uncompressed or as a "
                "PNG")
    if raw_mode not in _BMP_RAW_MODES[bits]:
        return ("8-bit BMP with a colour palette: TensorFlow decodes its indices as grey "
                "levels, Pillow as colours; re-save it as a PNG")
    needed = image.tile[0].offset + stride * image.size[1]
    size = f.seek(0, os.SEEK_END)
    if size < needed:
        return (f"truncated BMP ({size:,} bytes; its header declares {needed:,}: pixels from "
                f"byte {image.tile[0].offset:,}, {image.size[1]} rows of {image.size[0]} "
                "pixels); download or copy it again")
    if size > needed:
        return (f"BMP with {size - needed:,} bytes after its pixels ({size:,} bytes; its header "
                f"declares {needed:,}), which TensorFlow's decoder refuses; re-save it or "
                "convert it to a PNG")
    return None

