"""Augmentation of float32 [0, 1] images, stateless (every draw comes from a given seed).

* `pad_crop_flip`: the CIFAR-10 protocol on whole batches (random crop of the zero-padded image
  and a horizontal flip, as AETv1);
* `resize_crop`: the 224-pixel protocol on one image (shorter side resized to 256, a random
  224 crop and flip, or the centre crop for evaluation).
"""

from __future__ import annotations

import tensorflow as tf


def to_float(images) -> tf.Tensor:
    """uint8 in [0, 255] -> float32 in [0, 1]; float images are cast to float32 unchanged."""
    images = tf.convert_to_tensor(images)
    if images.dtype == tf.uint8:
        return tf.cast(images, tf.float32) / 255.0
    return tf.cast(images, tf.float32)


def pad_crop_flip(images, seed, pad: int, flip: bool = True) -> tf.Tensor:
    """Per-image random crop of the zero-padded batch, and a random horizontal flip.

    images (B, H, W, C) float; seed a stateless seed (2,). Crop offsets are uniform in
    ``{0..2 pad}`` (torchvision ``RandomCrop(H, padding=pad)``), flips have probability 1/2.
    One gather per axis for the whole batch.
    """
    images = tf.convert_to_tensor(images)
    height, width = images.shape[1], images.shape[2]
    b = tf.shape(images)[0]
    s_y, s_x, s_f = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
    oy = tf.random.stateless_uniform([b], s_y, 0, 2 * pad + 1, tf.int32)
    ox = tf.random.stateless_uniform([b], s_x, 0, 2 * pad + 1, tf.int32)
    cols = tf.range(width)[None, :]
    if flip:
        flipped = tf.random.stateless_uniform([b], s_f, 0, 2, tf.int32)[:, None] > 0
        cols = tf.where(flipped, width - 1 - cols, cols)
    padded = tf.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
    out = tf.gather(padded, oy[:, None] + tf.range(height)[None, :], axis=1, batch_dims=1)
    return tf.gather(out, ox[:, None] + cols, axis=2, batch_dims=1)


def resize_shorter_side(image, size: int) -> tf.Tensor:
    """(h, w, C) -> float32 [0, 1] image whose shorter side is ``size`` (bilinear, antialiased)."""
    image = to_float(image)
    hw = tf.cast(tf.shape(image)[:2], tf.float32)
    new_hw = tf.cast(tf.floor(hw * (size / tf.reduce_min(hw))), tf.int32)
    new_hw = tf.maximum(new_hw, size)
    return tf.clip_by_value(tf.image.resize(image, new_hw, antialias=True), 0.0, 1.0)


def resize_crop(image, seed, image_size: int, random: bool) -> tf.Tensor:
    """ImageNet protocol for one image: resize shorter side to ``image_size * 256 / 224``, then a
    random ``image_size`` crop and flip (``random``) or the centre crop; (S, S, 3) float32."""
    resized = resize_shorter_side(image, int(round(image_size * 256 / 224)))
    if random:
        s_crop, s_flip = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        crop = tf.image.stateless_random_crop(resized, [image_size, image_size, 3], s_crop)
        crop = tf.image.stateless_random_flip_left_right(crop, s_flip)
    else:
        hw = tf.shape(resized)[:2]
        top, left = (hw[0] - image_size) // 2, (hw[1] - image_size) // 2
        crop = resized[top:top + image_size, left:left + image_size]
    return tf.ensure_shape(crop, [image_size, image_size, 3])
