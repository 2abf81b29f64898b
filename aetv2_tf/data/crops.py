"""Crops of variable-size images, taken before the shuffle buffer (ImageNet/Places protocol).

`crops` maps ``(image (H, W, 3) uint8 or float, label)`` of any size to ``((S, S, 3) float32
[0, 1] crop, label)`` (`augment.resize_crop`) BEFORE the training shuffle: the buffer holds
crops (1,024 x 224^2 x 3 float32 = 0.6 GB) whatever the files' size.
"""

from __future__ import annotations

import tensorflow as tf

from aetv2_tf.data.augment import resize_crop


def crops(ds: tf.data.Dataset, element_seed: tf.Tensor, shuffle_seed: int, *, image_size: int,
          augment: bool, training: bool, repeat: bool, buffer: int) -> tf.data.Dataset:
    """Variable-size (image, label) -> ((S, S, 3) float32 crop, label), ``S = image_size``.

    ``element_seed`` (a stateless (2,) seed) is folded with each element's key: in training, a
    key of a ``Dataset.random`` seeded by ``shuffle_seed`` and redrawn every iteration (a new
    crop each epoch), then shuffled in a ``buffer``-element buffer; in evaluation, its index."""
    if repeat:
        ds = ds.repeat()
    if training:
        keys = tf.data.Dataset.random(seed=shuffle_seed, rerandomize_each_iteration=True)
    else:
        keys = tf.data.Dataset.range(2**62)

    @tf.autograph.experimental.do_not_convert
    def per_element(key, element):
        image, label = element
        s = tf.random.experimental.stateless_fold_in(element_seed, key)
        return resize_crop(image, s, image_size, augment), label

    ds = tf.data.Dataset.zip(keys, ds).map(per_element, num_parallel_calls=tf.data.AUTOTUNE)
    if training:
        ds = ds.shuffle(buffer, seed=shuffle_seed, reshuffle_each_iteration=True)
    return ds
