"""Image files on disk (ImageNet/Places-style class folders): the list, the check, the decode.

A training run over 1.28 M files must neither crash in the middle of an epoch on one bad file
nor lose its exact resume. So every file list is checked ONCE, when it is made, before any
order is drawn (`check_image_file`, a few reads per file, no decoding), and the files that fail
are left out of the list with their names and reasons logged (`image_files`). The training
order is then a pure function of (seed, epoch) over the good files (`pipelines`), whatever the
bad files were.

The check reads the first 64 bytes and the last 1 KiB of each file, and its headers with Pillow
(`headers`: lazily, the pixels are not decoded; a GIF's blocks to its trailer):

* empty file, or no JPEG / PNG / GIF / BMP signature (a text or HTML file named ``.jpg``);
* a JPEG with no end-of-image marker ``FF D9`` in its last 1 KiB (a truncated download: TF's
  decoder fails on it with "Premature end of JPEG file"); JPEG entropy data cannot hold
  ``FF D9`` (``FF`` is always stuffed there), so the marker only appears as a real end;
* a PNG with no ``IEND`` chunk in its last 1 KiB (truncated);
* headers Pillow cannot read (a 12-bit JPEG, a damaged PNG IHDR), a coding TensorFlow cannot
  decode (a lossless JPEG, a 1-bit, OS/2 or RLE BMP), one the two decoders would decode
  differently (an 8-bit BMP with a colour palette, a GIF whose first frame does not cover its
  screen), a truncated GIF or BMP, or one declaring more than `headers.MAX_IMAGE_PIXELS` pixels
  (89.5 M, Pillow's limit: a decompression bomb, whose decode would fail or exhaust memory at
  its first batch on every rerun; a GIF's frames are bounded too).

What passes decodes to the same uint8 RGB pixels with TensorFlow (`decode_image_file`,
`augment.decode_rgb`) and with Pillow (`data.stream.rgb_image`, the reader of Keras on JAX):
tests/test_image_files.py compares them per format and depth. A PNG named ``.JPEG`` (ImageNet
has one) and CMYK JPEGs (22 in ImageNet) decode: they pass. What the check cannot see (a JPEG
corrupt in the middle) decodes with libjpeg's warnings, as measured in tests/test_image_files.py.
A JPEG with more than 1 KiB of other data after its end marker (a "motion photo") is refused
although it decodes: rare in photo datasets, and named in the log. Cost per file:
BENCHMARKS.md, "Checking image files".
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
from absl import logging

from aetv2_tf.data.headers import MAX_IMAGE_PIXELS, header_problem  # noqa: F401

_HEAD, _TAIL = 64, 1024
_SIGNATURES = {b"\xff\xd8\xff": "jpeg", b"\x89PNG\r\n\x1a\n": "png", b"GIF87a": "gif",
               b"GIF89a": "gif", b"BM": "bmp"}


class ImageFiles(NamedTuple):
    """A checked file list: ``paths`` (N,) str, ``labels`` (N,) int64 (index into
    ``class_names``), and the files left out as ``(path, reason)`` pairs."""

    paths: np.ndarray
    labels: np.ndarray
    class_names: list[str]
    skipped: list[tuple[str, str]]

    def subset(self, n: int, seed: int) -> ImageFiles:
        """A seeded random subset of ``n`` files (a folder list is sorted by class: its first
        ``n`` would be its first classes), in list order."""
        keep = np.sort(np.random.default_rng(seed).permutation(len(self.paths))[:n])
        return self._replace(paths=self.paths[keep], labels=self.labels[keep])


def check_image_file(path: str) -> str | None:
    """Why the file at ``path`` cannot be decoded (module docstring), or None if it looks whole.
    A file that cannot be read at all raises OSError: that is the disk's or the network's
    trouble, not the file's, and leaving it out on one worker only would give the workers of a
    run different file lists."""
    with open(path, "rb") as f:
        head = f.read(_HEAD)
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - _TAIL))
        tail = f.read()
        if not head:
            return "empty file"
        kind = next((k for sig, k in _SIGNATURES.items() if head.startswith(sig)), None)
        if kind is None:
            return f"not an image (starts with {head[:8]!r})"
        if kind == "jpeg" and b"\xff\xd9" not in tail:
            return "truncated JPEG (no end-of-image marker)"
        if kind == "png" and b"IEND" not in tail:
            return "truncated PNG (no IEND chunk)"
        return header_problem(f, kind, head)


def check_image_files(paths: Sequence[str], threads: int = 4) -> list[tuple[str, str]]:
    """``(path, reason)`` of every file of ``paths`` that `check_image_file` refuses, in order.
    Threads overlap the reads: 4 were fastest on a cold local disk (BENCHMARKS.md)."""
    with ThreadPoolExecutor(max_workers=threads) as pool:
        reasons = list(pool.map(check_image_file, paths, chunksize=256))
    return [(p, r) for p, r in zip(paths, reasons, strict=True) if r is not None]


def image_files(paths: Sequence[str], labels: np.ndarray, class_names: list[str], where: str,
                unread: Sequence[tuple[str, str]] = ()) -> ImageFiles:
    """Checks ``paths`` and leaves out the bad files; logs them, and the entries of the folder
    ``where`` that are not read as images (``unread``, ``(path, reason)``), counted and named;
    ``skipped`` holds both."""
    skipped = check_image_files(paths)
    if skipped:
        bad = {p for p, _ in skipped}
        keep = np.asarray([p not in bad for p in paths], bool)
        paths, labels = np.asarray(paths)[keep], np.asarray(labels)[keep]
        logging.warning("Skipped %d undecodable image(s) of %d in %s: %s", len(skipped),
                        len(keep), where, named(skipped))
    if unread:
        logging.warning("Left out %d file(s) of %s that are not read as images: %s",
                        len(unread), where, named(unread))
    return ImageFiles(np.asarray(paths, dtype=str), np.asarray(labels, np.int64), class_names,
                      skipped + list(unread))


def named(entries: Sequence[tuple[str, str]], most: int = 100) -> str:
    """``path (reason); ...`` of the first ``most`` ``entries``, then how many more."""
    more = f"; and {len(entries) - most} more" if len(entries) > most else ""
    return "; ".join(f"{p} ({r})" for p, r in entries[:most]) + more


def decode_image_file(path, label):
    """(path, label) -> (image uint8 (h, w, 3), label): any of the checked formats, as RGB
    (`augment.decode_rgb`: the pixels Pillow gives)."""
    import tensorflow as tf

    from aetv2_tf.data.augment import decode_rgb

    return decode_rgb(tf.io.read_file(path)), label
