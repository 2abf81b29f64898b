"""Folder readers, per CPU-second: `python -m benchmarks.readers`.

The same folder (`benchmarks.check_files`'s 5,000 CIFAR-10 images as 256-pixel JPEGs) read by
the three paths of the programs, after one warm-up batch, timed over `--batches` batches of
`--batch_size`, with the process's CPU time (user + system, all threads):

* `tf.data pretext`: `pipelines.pretext_dataset` on the file list (decode, resize to 256, random
  224 crop and flip, homography warp, normalisation): what the TensorFlow program trains on;
* `tf.data probe`: `pipelines.classification_dataset` (the same without the warp);
* `Pillow, N threads`: `stream.FileBatches` (decode, resize, crop, flip; uint8, the warp is on the
  device), what the JAX program trains on, its batches read by N threads as Keras does.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import resource
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from aetv2_tf.data.constants import IMAGENET_MEAN, IMAGENET_STD
from aetv2_tf.data.sources import list_image_folder
from aetv2_tf.data.stream import FileBatches
from benchmarks.make_folder import write_cifar10_folder


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(read: Callable[[], None], images: int) -> tuple[float, float]:
    """(images per wall second, images per CPU-second) of `read()`."""
    cpu, wall = cpu_seconds(), time.perf_counter()
    read()
    return images / (time.perf_counter() - wall), images / (cpu_seconds() - cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/tmp/aetv2_check_files")
    parser.add_argument("--per_class", type=int, default=500)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()
    if not pathlib.Path(args.root).exists():
        write_cifar10_folder(args.root, train_per_class=args.per_class, val_per_class=0,
                             size=256)
    from aetv2_tf.data.pipelines import classification_dataset, pretext_dataset

    files = list_image_folder(args.root, "train")
    b, n = args.batch_size, args.batches
    rows = []
    for name, ds in (
            ("tf.data pretext", pretext_dataset(files, b, seed=0, image_size=224,
                                                mean=IMAGENET_MEAN, std=IMAGENET_STD)),
            ("tf.data probe", classification_dataset(
                files, None, b, seed=0, training=True, image_size=224, repeat=True,
                drop_remainder=True, mean=IMAGENET_MEAN, std=IMAGENET_STD))):
        it = iter(ds)
        next(it)
        rows.append((name, *measure(lambda it=it: [next(it) for _ in range(n)], n * b)))
    for threads in sorted({1, os.cpu_count() or 1}):
        batches = FileBatches(files, b, 0, 0, n + 1, size=224)
        batches[0]
        with ThreadPoolExecutor(threads) as pool:
            rows.append((f"Pillow, {threads} threads", *measure(
                lambda pool=pool, batches=batches: list(pool.map(batches.__getitem__,
                                                                 range(1, n + 1))), n * b)))
    print("| reader | images/s | images per CPU-s |\n|---|---|---|")
    for name, wall, per_cpu in rows:
        print(f"| {name} | {wall:.0f} | {per_cpu:.0f} |")


if __name__ == "__main__":
    main()
