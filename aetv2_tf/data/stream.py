"""uint8 image batches for `model.fit` on any Keras backend: NumPy only, a pure function of
(seed, step), so that a resumed run continues exactly where it stopped.

Batch `s` (a global training step, 0-based) holds the images
`order(e)[i * B : (i + 1) * B]` with `e = s // steps_per_epoch`, `i = s % steps_per_epoch`,
`steps_per_epoch = N // B` (the last partial batch of an epoch is dropped, as the tf.data
pipelines do), and `order(e) = numpy.random.default_rng([seed, e]).permutation(N)`.
Batches are `(B, H, W, 3)` uint8 arrays: augmentation, homographies and normalisation happen on
the device inside the compiled step (`aetv2_tf.data.device.HomographyPairs`). The order differs
from the TensorFlow program's (another RNG); the distribution is the same.
"""

from __future__ import annotations

import keras
import numpy as np


class ImageBatches(keras.utils.PyDataset):
    """The batches of steps `start .. stop - 1` (module docstring); item `i` is step `start + i`.

    Fit it with `shuffle=False` (Keras would otherwise permute the items).
    """

    def __init__(self, images: np.ndarray, batch_size: int, seed: int, start: int, stop: int,
                 **kwargs):
        super().__init__(**kwargs)
        if len(images) < batch_size:
            raise ValueError(f"{len(images)} images are fewer than one batch of {batch_size}")
        self.images, self.batch_size, self.seed = images, int(batch_size), int(seed)
        self.start, self.stop = int(start), int(stop)
        self.steps_per_epoch = len(images) // self.batch_size
        self._epoch, self._order = None, None

    def __len__(self) -> int:
        return max(self.stop - self.start, 0)

    def order(self, epoch: int) -> np.ndarray:
        """The permutation of the images in `epoch`."""
        if epoch != self._epoch:
            self._epoch = epoch
            self._order = np.random.default_rng([self.seed, epoch]).permutation(len(self.images))
        return self._order

    def batch(self, step: int) -> np.ndarray:
        """The uint8 batch `(B, H, W, 3)` of global step `step`."""
        epoch, index = divmod(int(step), self.steps_per_epoch)
        rows = self.order(epoch)[index * self.batch_size:(index + 1) * self.batch_size]
        return self.images[rows]

    def __getitem__(self, index: int) -> np.ndarray:
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self.batch(self.start + index)
