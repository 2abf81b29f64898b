"""What the start-up check of a folder costs per file: `python -m benchmarks.check_files`.

Makes (once) a folder of CIFAR-10 images as 256-pixel JPEGs (`benchmarks.make_folder`, about
8 KiB each), then times `data.image_folders.check_image_files` over it with 1, 4 and 16 threads,
with the page cache dropped before each pass (`--cold`, needs root) or warm, and the whole listing
(`sources.list_image_folder`: directory walk + check), and prints the time per file and for
ImageNet's 1,281,167 training files.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import time

from aetv2_tf.data.image_folders import check_image_files
from aetv2_tf.data.sources import list_image_folder
from benchmarks.make_folder import write_cifar10_folder

IMAGENET_TRAIN = 1_281_167


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/tmp/aetv2_check_files")
    parser.add_argument("--per_class", type=int, default=500)
    parser.add_argument("--cold", action="store_true", help="drop the page cache (root)")
    args = parser.parse_args()
    root = pathlib.Path(args.root)
    if not root.exists():
        write_cifar10_folder(root, train_per_class=args.per_class, val_per_class=0, size=256)
    paths = [str(p) for p in sorted(root.rglob("*.JPEG"))]

    def timed(fn) -> float:
        if args.cold:
            subprocess.run("sync; echo 3 > /proc/sys/vm/drop_caches", shell=True, check=True)
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) / len(paths)

    cache = "cold" if args.cold else "warm"
    for threads in (1, 4, 16):
        per_file = timed(lambda t=threads: check_image_files(paths, threads=t))
        print(f"| check, {threads} threads, {cache} | {per_file * 1e6:.1f} us | "
              f"{per_file * IMAGENET_TRAIN:.0f} s |")
    per_file = timed(lambda: list_image_folder(root, "train"))
    print(f"| listing + check (4 threads), {cache} | {per_file * 1e6:.1f} us | "
          f"{per_file * IMAGENET_TRAIN:.0f} s |")


if __name__ == "__main__":
    main()
