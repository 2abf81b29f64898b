"""Image files and folders the tests write, and a folder's digest: random JPEG bytes, whether
the two decoders make of a file, class folders of random images, `tree` for "nothing touched", and
what a run folder holds: the flags of a minimal run (`run_flags`, `ESSENTIAL`) for
`rundir.prepare`, a probe's results.json (`make_result`); a file damaged as a crash or a bad
disk leaves it (`damage_file`).

Folders of CIFAR-10 images (the ILSVRC layout, bad files, a prepared tensorflow-datasets copy)
are `benchmarks.make_folder`'s: the folder benchmarks (check_files, readers, imagenet_input) make
them too, and the tests import them from there.
"""

from __future__ import annotations

import hashlib
import os
import pathlib

import numpy as np

#: The essential flags of `run_flags`' runs: another value of one of them is another run.
ESSENTIAL = ("stage", "backbone", "dataset", "loss", "batch_size")


def jpeg_bytes(shape: tuple[int, int, int] = (16, 24, 3), seed: int = 0) -> bytes:
    """A JPEG (quality 90) of seeded uniform noise of `shape` (height, width, 3)."""
    import tensorflow as tf

    image = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    return tf.io.encode_jpeg(image, quality=90).numpy()


def decoded(path) -> tuple[np.ndarray | None, np.ndarray | None]:
    """What the two decoders of the training input make of the file at `path`: TensorFlow's
    (`aetv2_tf.data.image_folders.decode_image_file`) and Pillow's (`aetv2_tf.data.stream.
    rgb_image`, the Keras-on-JAX reader's), each uint8 (h, w, 3), or None where it fails."""
    import tensorflow as tf
    from PIL import Image

    from aetv2_tf.data.image_folders import decode_image_file
    from aetv2_tf.data.stream import rgb_image

    try:
        by_tensorflow = decode_image_file(str(path), 0)[0].numpy()
    except tf.errors.InvalidArgumentError:
        by_tensorflow = None
    try:
        with Image.open(path) as image:
            by_pillow = np.asarray(rgb_image(image))
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        by_pillow = None
    return by_tensorflow, by_pillow


def decodes(path) -> bool:
    """Whether TensorFlow's decoder of the training input reads the file at `path`."""
    return decoded(path)[0] is not None


def decodes_alike(path) -> bool:
    """Whether both decoders (`decoded`) read the file at `path`, to the same pixels."""
    by_tensorflow, by_pillow = decoded(path)
    return by_tensorflow is not None and by_pillow is not None and \
        np.array_equal(by_tensorflow, by_pillow)


def write_image_folder(root: pathlib.Path, per_class: dict[str, int], seed: int = 0) -> None:
    """root/<split>/<class>/<i>.{png,jpg}: random images of random sizes (2 classes), e.g.
    ``per_class={"train": 6, "val": 3}``."""
    import cv2

    rng = np.random.default_rng(seed)
    for split, count in per_class.items():
        for name in ("beach", "forest"):
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                height, width = rng.integers(40, 120, size=2)
                image = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
                assert cv2.imwrite(str(root / split / name / f"{i}.{('png', 'jpg')[i % 2]}"),
                                   image)


def tree(root: pathlib.Path) -> dict[str, str]:
    """{relative path: SHA-256} of every file under `root` (links by their target text, folders
    as "dir"): a folder's "nothing touched" checked byte for byte."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


def run_flags(**changes) -> dict:
    """The recorded flags (flags.json) of a minimal pretext run, with `changes`."""
    return {"stage": "pretext", "backbone": "nin", "dataset": "cifar10", "loss": "geodesic",
            "batch_size": 16, **changes}


def make_result(probe, test_error, *, feature="block2", dataset="cifar10", pretrained=None,
                method=None, test_examples=10000, test_top1=None) -> dict:
    """A probe's results (what `aetv2_tf.probes.results.write_results` takes) of a full CIFAR-10
    split, `test_error` % wrong."""
    result = dict(
        probe=probe, feature=feature, pretrained=pretrained, dataset=dataset,
        train_examples=45000, val_examples=5000, test_examples=test_examples,
        selected_epoch=None if probe == "knn" else 17, val_top1=80.0,
        test_top1=100.0 - test_error if test_top1 is None else test_top1,
        test_error=test_error, wall_time_s=12.5, flags={"probe": probe, "seed": 0},
    )
    if method:
        result["method"] = method
    return result


def damage_file(path: pathlib.Path, how: str) -> None:
    """Damages the file at `path` as a crash or a bad disk would: "truncated" (cut in half) or
    "overwritten" (4 KiB of zeros in the middle, the same size); a `how` ending in "no_checksum"
    also deletes its `.sha256` (or: a file of a version before the checksums)."""
    data = path.read_bytes()
    if how.startswith("truncated"):
        path.write_bytes(data[: len(data) // 2])
    else:
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes(4096) + data[middle + 4096:])
    if how.endswith("no_checksum"):
        pathlib.Path(f"{path}.sha256").unlink()
