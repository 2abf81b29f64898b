"""uint8 image batches for `model.fit` on any Keras backend: NumPy only, a pure function of
(seed, step), so that a resumed run continues exactly where it stopped.

Batch `s` (a global step) holds the images `order(e)[i * B : (i + 1) * B]`, `e, i =
divmod(s, N // B)` (an epoch's last partial batch dropped, as the tf.data pipelines do),
`order(e) = numpy.random.default_rng([seed, e]).permutation(N)`. Augmentation, homographies and
normalisation happen on the device (`data.preprocessing_layers`). The order differs from the
TensorFlow program's (another RNG); the distribution is the same.
"""

from __future__ import annotations

import keras
import numpy as np


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The permutation of `n` images in `epoch`: `default_rng([seed, epoch]).permutation(n)`."""
    return np.random.default_rng([int(seed), int(epoch)]).permutation(n)


class ImageBatches(keras.utils.PyDataset):
    """The batches of steps `start .. stop - 1` (module docstring); item `i` is step `start + i`.
    Fit it with `shuffle=False`."""

    def __init__(self, images: np.ndarray, batch_size: int, seed: int, start: int, stop: int,
                 **kwargs):
        super().__init__(**kwargs)
        if len(images) < batch_size:
            raise ValueError(f"{len(images)} images are fewer than one batch of {batch_size}")
        self.images, self.batch_size, self.seed = images, int(batch_size), int(seed)
        self.start, self.stop = int(start), int(stop)
        self.steps_per_epoch = len(images) // self.batch_size
        self._cache = (None, None)  # (epoch, order), replaced whole: reader threads share it

    def __len__(self) -> int:
        return max(self.stop - self.start, 0)

    def order(self, epoch: int) -> np.ndarray:
        """The permutation of the images in `epoch` (safe from several reader threads)."""
        cached_epoch, order = self._cache
        if cached_epoch != epoch:
            order = epoch_order(self.seed, epoch, len(self.images))
            self._cache = (epoch, order)
        return order

    def rows(self, step: int) -> np.ndarray:
        """The indices `(B,)` of the images of global step `step`."""
        epoch, index = divmod(int(step), self.steps_per_epoch)
        return self.order(epoch)[index * self.batch_size:(index + 1) * self.batch_size]

    def batch(self, step: int) -> np.ndarray:
        """The uint8 batch `(B, H, W, 3)` of global step `step`."""
        return self.images[self.rows(step)]

    def __getitem__(self, index: int) -> np.ndarray:
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self.batch(self.start + index)


def rgb_image(image):
    """An opened Pillow image -> RGB, the pixels TensorFlow's decoder gives
    (`augment.decode_rgb`): 16-bit grey by its high byte (Pillow's own conversion clips it),
    any other mode by ``convert("RGB")``."""
    from PIL import Image

    if image.mode == "I" or image.mode.startswith("I;16"):
        grey = (np.asarray(image).astype(np.uint32) >> 8).astype(np.uint8)
        return Image.fromarray(grey).convert("RGB")
    return image.convert("RGB")


def load_crop(path: str, size: int, rng: np.random.Generator | None) -> np.ndarray:
    """One image file -> uint8 `(size, size, 3)`: RGB (`rgb_image`), shorter side resized
    (bilinear, with Pillow's antialiasing) to `round(size * 256 / 224)`, then a random crop and
    flip drawn from `rng`, or the centre crop when `rng` is None."""
    from PIL import Image

    with Image.open(path) as image:
        image = rgb_image(image)
        width, height = image.size
        short = int(round(size * 256 / 224))
        scale = short / min(width, height)
        width, height = max(short, int(width * scale)), max(short, int(height * scale))
        image = image.resize((width, height), Image.BILINEAR)
    if rng is None:
        top, left, flip = (height - size) // 2, (width - size) // 2, False
    else:
        top, left = rng.integers(0, height - size + 1), rng.integers(0, width - size + 1)
        flip = bool(rng.integers(0, 2))
    crop = np.asarray(image)[top:top + size, left:left + size]
    return np.ascontiguousarray(crop[:, ::-1] if flip else crop)


class FileBatches(ImageBatches):
    """`ImageBatches` over a checked file list: element j of step `s` decoded by Pillow
    (`load_crop`, in `workers` threads) with `default_rng([seed, 1, s * B + j])` (random crop
    and flip; `augment=False`: the centre crop)."""

    def __init__(self, files, batch_size: int, seed: int, start: int, stop: int, size: int,
                 augment: bool = True, **kwargs):
        super().__init__(files.paths, batch_size, seed, start, stop, **kwargs)
        self.size, self.augment = int(size), bool(augment)

    def batch(self, step: int) -> np.ndarray:
        first = int(step) * self.batch_size
        return np.stack([
            load_crop(self.images[row], self.size,
                      np.random.default_rng([self.seed, 1, first + j]) if self.augment else None)
            for j, row in enumerate(self.rows(step))])


class LabelledBatches(keras.utils.PyDataset):
    """One epoch of `(images (B, H, W, 3) uint8, labels (B,) int64)` batches.

    `shuffle`: `fit` epoch `e` (counted by `on_epoch_begin`; reads before the first come from
    epoch 0) visits `epoch_order(seed, e, N)`; otherwise the images keep their order. The last
    batch is short, unless `full_batches` (several devices): then a training epoch's last batch
    is filled with the first images of its order, and evaluation batches carry sample weights
    `(B,)`, 0 for the copies of the last image that fill the last one.
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray, batch_size: int, seed: int,
                 shuffle: bool, full_batches: bool = False, **kwargs):
        super().__init__(**kwargs)
        if len(images) != len(labels) or not len(images):
            raise ValueError(f"{len(images)} images and {len(labels)} labels: need as many, "
                             "and at least one")
        self.images, self.labels = images, np.asarray(labels, np.int64)
        self.batch_size, self.seed, self.shuffle = int(batch_size), int(seed), bool(shuffle)
        self.full_batches = bool(full_batches)
        self.epoch, self._next_epoch, self._order = 0, 0, (None, None)

    def __len__(self) -> int:
        return -(-len(self.images) // self.batch_size)

    def __getitem__(self, index: int):
        if not 0 <= index < len(self):
            raise IndexError(index)
        n = len(self.images)
        rows = np.arange(index * self.batch_size, (index + 1) * self.batch_size)
        real = rows < n
        if not self.full_batches:
            rows = rows[real]
        rows = rows % n if self.shuffle else np.minimum(rows, n - 1)
        if self.shuffle:
            if self._order[0] != self.epoch:
                self._order = (self.epoch, epoch_order(self.seed, self.epoch, n))
            rows = self._order[1][rows]
        if self.full_batches and not self.shuffle:
            return self.images[rows], self.labels[rows], real.astype(np.float32)
        return self.images[rows], self.labels[rows]

    def on_epoch_begin(self) -> None:
        self.epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
