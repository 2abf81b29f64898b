"""ImageNet/Places-shaped data made from CIFAR-10, for the 224-pixel paths without ImageNet.

    python -m benchmarks.make_folder --out=/tmp/cifar_folder            # 10 classes, 256 px
    python -m benchmarks.make_folder --out=DIR --train_per_class=500 --val_per_class=50 --corrupt
    python -m benchmarks.make_folder --out=DIR --tfds=imagenet2012     # a prepared tfds copy
    python -m benchmarks.make_folder --out=DIR --photo --train_per_class=100  # ImageNet-sized files

Writes ``OUT/train/<class>/<i>.JPEG`` and ``OUT/val/<class>/<i>.JPEG`` (the ILSVRC layout: a
folder per class, upper-case ``.JPEG``): the first images of each CIFAR-10 class, upscaled
bilinearly to ``--size`` x ``--size`` and encoded at JPEG quality 90 (real photographs, as
ImageNet's, if blurry). ``--corrupt`` adds the bad files that real ImageNet-scale folders hold,
to the first training class: a truncated JPEG, a text file named ``.JPEG``, an empty file, and
a PNG named ``.JPEG`` (which decodes: ImageNet has one).

``--photo`` makes files of ImageNet's typical size and cost instead: 500 x 375 (landscape), the
CIFAR-10 image upscaled bicubically plus a seeded multi-scale grain (`PHOTO_GRAIN`), quality 90:
about 95 KB and 1.2-1.3 ms to decode on one core, as the issue measured on ImageNet's own
500 x 375 files (1.15-1.35 ms); a plain upscale would be 20 KB and decode 2x faster than a photo.

``--tfds=imagenet2012|places365_small`` instead prepares ``OUT/<name>/<version>/`` as
tensorflow-datasets would from the real archives (`prepare_tiny_tfds`: the real builder's
features and splits, "train" and "validation", with the CIFAR-10 images as examples), so that
``tfds.builder(name, data_dir=OUT)`` and the programs' ``--dataset=<name> --data_dir=OUT`` read
it offline. The labels are CIFAR-10's 10 classes, written as the first 10 of the dataset's.
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np

import aetv2_tf  # noqa: F401  (before TensorFlow: the oneDNN setting)
from aetv2_tf.data.constants import CIFAR10_CLASSES
from aetv2_tf.data.sources import load_cifar10

REPO = pathlib.Path(__file__).resolve().parents[1]
CIFAR10 = REPO.parent / "shared" / "data" / "cifar10" / "cifar-10-batches-py"
CLASS_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
               "truck")
#: The bad files of `--corrupt` and the reason `aetv2_tf.data.image_folders` gives for each (None:
#decodes). : The grain amplitude of `--photo` files (0-255 scale), chosen for ImageNet-like size and
#decode : time (module docstring).
PHOTO_GRAIN = 96.0
PHOTO_SIZE = (500, 375)  # (width, height)
CORRUPT_FILES = {"truncated.JPEG": "truncated JPEG", "text.JPEG": "not an image",
                 "empty.JPEG": "empty file", "png_inside.JPEG": None}


def photo_like(image: np.ndarray, size: tuple[int, int] = PHOTO_SIZE, grain: float = PHOTO_GRAIN,
               seed: int = 0) -> np.ndarray:
    """A small uint8 image -> (height, width, 3) uint8: bicubic upscale plus a grain of seeded
    noise at 1, 2, 4, 8 and 16 pixels (weights ``scale ** 0.25``), whose fine part gives JPEG
    files the entropy, hence the size and decode time, of photographs (module docstring)."""
    import tensorflow as tf

    width, height = size
    rng = np.random.default_rng(seed)
    big = tf.image.resize(image, (height, width), method="bicubic").numpy()
    grain_map = np.zeros((height, width, 1), np.float32)
    for s in (1, 2, 4, 8, 16):
        noise = rng.normal(size=(height // s + 1, width // s + 1, 1)).astype(np.float32)
        grain_map += tf.image.resize(noise, (height // s * s + s, width // s * s + s)).numpy()[
            :height, :width] * s ** 0.25
    return np.clip(big + grain * grain_map / 4, 0, 255).round().astype(np.uint8)


def write_cifar10_folder(root, cifar10_dir=CIFAR10, train_per_class: int = 8,
                         val_per_class: int = 2, size: int = 256,
                         corrupt: bool = False, photo: bool = False) -> pathlib.Path:
    """CIFAR-10 training images as ``root/{train,val}/<class>/<i>.JPEG`` (module docstring); the
    val split takes the images after the training ones of each class. ``photo``: 500 x 375
    ImageNet-like files (`photo_like`) instead of ``size`` squares. Returns ``root``."""
    import tensorflow as tf

    root = pathlib.Path(root)
    images, labels = load_cifar10(cifar10_dir, "train")
    for label in range(CIFAR10_CLASSES):
        chosen = np.flatnonzero(labels == label)[: train_per_class + val_per_class]
        for j, index in enumerate(chosen):
            split = "train" if j < train_per_class else "val"
            folder = root / split / CLASS_NAMES[label]
            folder.mkdir(parents=True, exist_ok=True)
            if photo:
                big = photo_like(images[index], seed=int(index))
            else:
                big = tf.cast(tf.round(tf.image.resize(images[index], (size, size),
                                                       antialias=False)), tf.uint8)
            jpeg = tf.io.encode_jpeg(big, quality=90)
            (folder / f"{j}.JPEG").write_bytes(jpeg.numpy())
    if corrupt:
        folder = root / "train" / CLASS_NAMES[0]
        whole = (folder / "0.JPEG").read_bytes()
        (folder / "truncated.JPEG").write_bytes(whole[: len(whole) // 2])
        (folder / "text.JPEG").write_text("<html>404 Not Found</html>\n")
        (folder / "empty.JPEG").write_bytes(b"")
        png = tf.io.encode_png(tf.fill([size, size, 3], tf.constant(128, tf.uint8)))
        (folder / "png_inside.JPEG").write_bytes(png.numpy())
    return root


def prepare_tiny_tfds(name: str, data_dir, cifar10_dir=CIFAR10, train_per_class: int = 4,
                      val_per_class: int = 1, size: int = 64) -> pathlib.Path:
    """A prepared tensorflow-datasets ``name`` in ``data_dir`` (module docstring); returns the
    data_dir. The real builder class writes it, its example generation replaced."""
    import tensorflow as tf
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core import registered

    images, labels = load_cifar10(cifar10_dir, "train")
    counts = {"train": train_per_class, "validation": val_per_class}

    def examples(split: str, features):
        offset = 0 if split == "train" else train_per_class
        side = features["image"].shape[0] or size  # places365_small's images are 256 x 256
        for label in range(CIFAR10_CLASSES):
            for j, index in enumerate(np.flatnonzero(labels == label)[offset:][:counts[split]]):
                image = tf.cast(tf.round(tf.image.resize(images[index], (side, side))), tf.uint8)
                example = {"image": image.numpy(), "label": label}
                for key in {"file_name", "filename"} & set(features):
                    example[key] = f"{CLASS_NAMES[label]}_{split}_{j}.JPEG"
                yield f"{split}-{label}-{j}", example

    # Look the real class up first: the lookup imports (and registers) tfds's other builders,
    # which must not happen inside `skip_registration` (they would stay unknown, cifar10 too).
    base = tfds.builder_cls(name)
    with registered.skip_registration():
        class Tiny(base):
            def _split_generators(self, dl_manager):
                return {split: examples(split, self.info.features) for split in counts}

        Tiny.name = name
        builder = Tiny(data_dir=str(data_dir))
    manual = pathlib.Path(data_dir) / "manual"
    manual.mkdir(parents=True, exist_ok=True)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
        manual_dir=str(manual)))
    return pathlib.Path(data_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--cifar10_dir", default=str(CIFAR10))
    parser.add_argument("--train_per_class", type=int, default=8)
    parser.add_argument("--val_per_class", type=int, default=2)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--corrupt", action="store_true")
    parser.add_argument("--photo", action="store_true", help="500 x 375 ImageNet-like files")
    parser.add_argument("--tfds", choices=("imagenet2012", "places365_small"), default=None)
    args = parser.parse_args()
    if args.tfds:
        prepare_tiny_tfds(args.tfds, args.out, args.cifar10_dir, args.train_per_class,
                          args.val_per_class, args.size)
        print(f"{args.out}: tensorflow-datasets {args.tfds} prepared")
        return
    root = write_cifar10_folder(args.out, args.cifar10_dir, args.train_per_class,
                                args.val_per_class, args.size, args.corrupt, args.photo)
    files = list(root.rglob("*.JPEG"))
    size = "500 x 375" if args.photo else f"{args.size} px"
    kb = sum(f.stat().st_size for f in files) / max(len(files), 1) / 1024
    print(f"{root}: {len(files)} files, {CIFAR10_CLASSES} classes, {size}, {kb:.0f} KB each")


if __name__ == "__main__":
    main()
