"""The CIFAR-10 training images as JPEG mosaics that travel to a device machine, and back.

    python -m experiments.campaign.pack pack                      # -> .devdata/cifar10-jpeg90
    python -m experiments.campaign.pack unpack .devdata/cifar10-jpeg90 /tmp/c10/cifar-10-batches-py

A device call carries at most 64 MiB (the tracked files included); the 50,000 raw training
images are 154 MB. `pack` writes each official training batch as ONE progressive,
Huffman-optimised JPEG with 4:4:4 chroma: its images laid out row-major on a grid of 32x32 tiles,
so that every image covers whole 8x8 JPEG blocks and none bleeds into another; beside them
``pack.json`` with the SHA-256 of each JPEG and of the pixels it decodes to here, the labels, and
the pack's error against the originals. At quality 90: 27.5 MB, mean absolute error 2.96 levels
(of 255) and at most 47 (measured on the 50,000 images, docs/campaign.md, where the evidence that
this error leaves the learned features unchanged is recorded too).

`unpack` checks each JPEG's SHA-256 (a damaged pack stops here), decodes it and checks the
pixels' SHA-256 against what the packer decoded: another decoder that rounds otherwise would
train on other pixels, so it is refused (``--allow_other_decoder`` accepts it and says so). It
writes the official python layout (``data_batch_1`` .. ``data_batch_5``: pickles of dicts with
the bytes keys b"data" (N, 3072) uint8 in channel-major order and b"labels"), which
``--data_dir`` of the training program reads like the original files.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import pathlib
import pickle
import sys

import numpy as np

FORMAT = "aetv2_tf CIFAR-10 JPEG pack, version 1"
MANIFEST = "pack.json"
TILE = 32
BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
REPO = pathlib.Path(__file__).resolve().parents[2]
#: The pack's folder in the checkout (ignored; carried by the leg's device call).
PACK_FOLDER = ".devdata/cifar10-jpeg90"
DEFAULT_PACK = REPO / PACK_FOLDER


class PackError(ValueError):
    """A pack that is missing, damaged, or decodes to other pixels; the message says the fix."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def grid_columns(count: int) -> int:
    """Tiles per row of a mosaic of ``count`` images: the smallest square grid that holds them."""
    return max(1, math.isqrt(count - 1) + 1) if count > 1 else 1


def to_mosaic(images: np.ndarray) -> np.ndarray:
    """(N, 32, 32, 3) uint8 -> (rows * 32, columns * 32, 3): image i at tile (i // columns,
    i % columns), the tiles after the last one black."""
    count = len(images)
    columns = grid_columns(count)
    rows = -(-count // columns)
    tiles = np.zeros((rows * columns, TILE, TILE, 3), np.uint8)
    tiles[:count] = images
    return tiles.reshape(rows, columns, TILE, TILE, 3).transpose(0, 2, 1, 3, 4).reshape(
        rows * TILE, columns * TILE, 3)


def from_mosaic(mosaic: np.ndarray, count: int) -> np.ndarray:
    """The inverse of `to_mosaic`: the first ``count`` tiles as (count, 32, 32, 3)."""
    rows, columns = mosaic.shape[0] // TILE, mosaic.shape[1] // TILE
    tiles = mosaic.reshape(rows, TILE, columns, TILE, 3).transpose(0, 2, 1, 3, 4)
    return np.ascontiguousarray(tiles.reshape(rows * columns, TILE, TILE, 3)[:count])


def encode_jpeg(mosaic: np.ndarray, quality: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(mosaic).save(buffer, "JPEG", quality=quality, subsampling=0,
                                 optimize=True, progressive=True)
    return buffer.getvalue()


def decode_jpeg(data: bytes) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format != "JPEG":
                raise PackError(f"expected a JPEG, found {image.format}")
            return np.asarray(image.convert("RGB"))
    except (OSError, ValueError) as e:
        if isinstance(e, PackError):
            raise
        raise PackError(f"not a decodable JPEG ({e}); make or copy the pack again") from e


def read_cifar10(source: pathlib.Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    """One official batch as (N, 32, 32, 3) uint8 images and (N,) labels, read with the
    project's restricted unpickler."""
    from aetv2_tf.data.sources import _batch_arrays, _unpickle

    batch = _unpickle(source / name)
    data, labels = _batch_arrays(source / name, batch.get(b"data"), batch.get(b"labels"))
    return data.reshape(-1, 3, TILE, TILE).transpose(0, 2, 3, 1), labels


def pack(source: pathlib.Path, out: pathlib.Path, quality: int = 90,
         per_batch: int = 0) -> dict:
    """Writes the pack of the training batches of ``source`` (the first ``per_batch`` images of
    each, 0: all) to ``out``; returns its manifest (module docstring)."""
    import PIL

    if not 1 <= quality <= 100:
        raise PackError(f"quality must be in 1..100; got {quality}")
    out.mkdir(parents=True, exist_ok=True)
    entries, errors = [], []
    for name in BATCHES:
        images, labels = read_cifar10(source, name)
        if per_batch:
            images, labels = images[:per_batch], labels[:per_batch]
        jpeg = encode_jpeg(to_mosaic(images), quality)
        decoded = from_mosaic(decode_jpeg(jpeg), len(images))
        errors.append(np.abs(decoded.astype(np.int16) - images.astype(np.int16)))
        write_bytes(out / f"{name}.jpg", jpeg)
        entries.append(dict(name=name, file=f"{name}.jpg", count=len(images),
                            jpeg_sha256=sha256(jpeg), pixels_sha256=sha256(decoded.tobytes()),
                            labels="".join(str(int(v)) for v in labels)))
    error = np.concatenate([e.ravel() for e in errors])
    manifest = dict(format=FORMAT, quality=quality, subsampling="4:4:4", progressive=True,
                    encoder=f"Pillow {PIL.__version__}", tile=TILE, batches=entries,
                    images=sum(e["count"] for e in entries),
                    bytes=sum((out / e["file"]).stat().st_size for e in entries),
                    mean_abs_error=round(float(error.mean()), 4),
                    max_abs_error=int(error.max()))
    write_bytes(out / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
    return manifest


def read_manifest(pack_dir: pathlib.Path) -> dict:
    path = pack_dir / MANIFEST
    if not path.is_file():
        raise PackError(f"{path} is missing: {pack_dir} is not a pack; make one with python -m "
                        "experiments.campaign.pack pack")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise PackError(f"{path} is not readable JSON ({e}); make the pack again") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise PackError(f"{path} is not a manifest of {FORMAT!r}; make the pack again")
    batches = manifest.get("batches")
    if not isinstance(batches, list) or [b.get("name") for b in batches] != list(BATCHES):
        raise PackError(f"{path} does not list the batches {list(BATCHES)}; make the pack again")
    for entry in batches:
        count, labels = entry.get("count"), entry.get("labels")
        if not (isinstance(count, int) and 0 < count <= 10_000 and isinstance(labels, str)
                and len(labels) == count and labels.isdigit()):
            raise PackError(f"{path}: batch {entry.get('name')} has a bad count or labels; make "
                            "the pack again")
    return manifest


def unpack(pack_dir: pathlib.Path, out: pathlib.Path,
           allow_other_decoder: bool = False) -> list[str]:
    """Decodes the pack ``pack_dir`` into the official python layout in ``out`` (module
    docstring); returns the notes to print (a decoder that differs, when allowed)."""
    manifest = read_manifest(pack_dir)
    out.mkdir(parents=True, exist_ok=True)
    notes = []
    for entry in manifest["batches"]:
        path = pack_dir / entry["file"]
        try:
            jpeg = path.read_bytes()
        except OSError as e:
            raise PackError(f"{path}: not readable ({e}); make or copy the pack again") from e
        if sha256(jpeg) != entry["jpeg_sha256"]:
            raise PackError(f"{path}: its SHA-256 differs from {MANIFEST}'s: the file is damaged "
                            "or of another pack; make or copy the pack again")
        count = entry["count"]
        columns = grid_columns(count)
        mosaic = decode_jpeg(jpeg)
        expected = (-(-count // columns) * TILE, columns * TILE, 3)
        if mosaic.shape != expected:
            raise PackError(f"{path}: a {mosaic.shape} mosaic, expected {expected}")
        images = from_mosaic(mosaic, count)
        if sha256(images.tobytes()) != entry["pixels_sha256"]:
            import PIL

            note = (f"{path}: this decoder (Pillow {PIL.__version__}) gives other pixels than "
                    f"the packer's ({manifest['encoder']})")
            if not allow_other_decoder:
                raise PackError(f"{note}: the runs would train on other images than those the "
                                "pack was made and checked with; decode with the packer's "
                                "Pillow, or pass --allow_other_decoder")
            notes.append(note)
        labels = [int(c) for c in entry["labels"]]
        batch = {b"batch_label": f"{entry['name']} ({FORMAT}, quality "
                                 f"{manifest['quality']})".encode(),
                 b"labels": labels,
                 b"data": np.ascontiguousarray(images.transpose(0, 3, 1, 2).reshape(count, -1)),
                 b"filenames": []}
        write_bytes(out / entry["name"], pickle.dumps(batch, protocol=4))
    return notes


def write_bytes(path: pathlib.Path, data: bytes) -> None:
    """Writes ``data`` to a temporary file beside ``path`` and renames it into place; refuses to
    write through a symbolic link."""
    if path.is_symlink():
        raise PackError(f"{path} is a symbolic link: not written through; remove it or choose "
                        "another folder")
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = p.add_subparsers(dest="command", required=True)
    make = commands.add_parser("pack", help="CIFAR-10's training batches -> a pack")
    make.add_argument("--source", type=pathlib.Path, default=None,
                      help="the cifar-10-batches-py folder (default: $AETV2_CIFAR10_DIR or "
                           "../shared's, `luggage.cifar10_source`)")
    make.add_argument("--out", type=pathlib.Path, default=DEFAULT_PACK)
    make.add_argument("--quality", type=int, default=90)
    make.add_argument("--per_batch", type=int, default=0,
                      help="only the first N images of each batch (tests; 0: all)")
    undo = commands.add_parser("unpack", help="a pack -> the official python layout")
    undo.add_argument("pack", type=pathlib.Path)
    undo.add_argument("out", type=pathlib.Path)
    undo.add_argument("--allow_other_decoder", action="store_true")
    args = p.parse_args(argv)
    try:
        if args.command == "pack":
            from experiments.campaign.luggage import cifar10_source

            m = pack(args.source or cifar10_source(), args.out, args.quality, args.per_batch)
            print(f"{args.out}: {m['images']} images, {m['bytes'] / 1e6:.1f} MB at quality "
                  f"{m['quality']} (4:4:4), mean absolute error {m['mean_abs_error']:.2f}, "
                  f"max {m['max_abs_error']} levels")
        else:
            for note in unpack(args.pack, args.out, args.allow_other_decoder):
                print(f"note: {note}")
            print(f"{args.out}: the official python layout of {args.pack}")
    except PackError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
