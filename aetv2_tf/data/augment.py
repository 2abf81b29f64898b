"""Augmentation of float32 [0, 1] images, stateless (every draw comes from a given seed): the
CIFAR-10 protocol on batches (`pad_crop_flip`), the 224-pixel protocol on one image
(`resize_crop`) or from its encoded file (`decode_resize_crop`), and the decoder (`decode_rgb`).
"""

from __future__ import annotations

import tensorflow as tf


def to_float(images) -> tf.Tensor:
    """uint8 in [0, 255] -> float32 in [0, 1]; float images are cast to float32 unchanged."""
    images = tf.convert_to_tensor(images)
    if images.dtype == tf.uint8:
        return tf.cast(images, tf.float32) / 255.0
    return tf.cast(images, tf.float32)


#: libjpeg's accurate integer inverse DCT, Pillow's: TensorFlow's default ("INTEGER_FAST")
#: differs from it by up to 5 levels.
JPEG_DCT = "INTEGER_ACCURATE"


def decode_rgb(contents) -> tf.Tensor:
    """An encoded JPEG, PNG, GIF (its first frame) or BMP -> uint8 ``(h, w, 3)`` RGB, the pixels
    Pillow gives (`data.stream.rgb_image`): JPEGs with `JPEG_DCT`, 16-bit channels by their high
    byte, alpha dropped, palettes applied (8-bit BMPs as grey: `data.headers`)."""
    contents = tf.convert_to_tensor(contents)

    def jpeg():
        return tf.io.decode_jpeg(contents, channels=3, dct_method=JPEG_DCT)

    def other():
        return tf.io.decode_image(contents, channels=3, expand_animations=False)

    image = tf.cond(tf.io.is_jpeg(contents), jpeg, other)
    return tf.ensure_shape(tf.cast(image, tf.uint8), [None, None, 3])


def pad_crop_flip(images, seed, pad: int, flip: bool = True) -> tf.Tensor:
    """Per-image random crop of the zero-padded batch (B, H, W, C) float, offsets uniform in
    ``{0..2 pad}`` (torchvision ``RandomCrop(H, padding=pad)``), and a horizontal flip with
    probability 1/2; ``seed`` a stateless seed (2,)."""
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


def _crop_plan(hw, seed, image_size: int, random: bool):
    """Where the 224-pixel protocol's crop lies in an (h, w) image, without resizing it: the
    image resized to ``new_hw`` (shorter side ``round(S * 256 / 224)``), the S x S crop at
    ``offset`` in it (the draws of ``tf.image.stateless_random_crop`` and
    ``stateless_random_flip_left_right`` with the same seeds). Returns ``(scale (2,) float32 =
    new_hw / hw, offset (2,) int32, flip bool, lo (2,) int32, hi (2,) int32)``: the window
    ``[lo, hi)`` of the ORIGINAL image holds every pixel the antialiased resize reads for the
    crop (the triangle kernel's support, 1 / scale pixels when shrinking, plus one)."""
    target = int(round(image_size * 256 / 224))
    hw = tf.cast(hw, tf.int32)
    hw_f = tf.cast(hw, tf.float32)
    new_hw = tf.maximum(tf.cast(tf.floor(hw_f * (target / tf.reduce_min(hw_f))), tf.int32),
                        target)
    scale = tf.cast(new_hw, tf.float32) / hw_f
    if random:
        s_crop, s_flip = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        limit = tf.concat([new_hw - image_size + 1, [1]], 0)  # (h, w, channels) as random_crop
        offset = (tf.random.stateless_uniform([3], s_crop, maxval=tf.int32.max,
                                              dtype=tf.int32) % limit)[:2]
        flip = tf.random.stateless_uniform([], s_flip, 0, 1.0) < 0.5
    else:
        offset, flip = (new_hw - image_size) // 2, tf.constant(False)
    first, radius = tf.cast(offset, tf.float32), tf.maximum(1.0, 1.0 / scale) + 1.0
    lo = tf.maximum(tf.cast(tf.floor((first + 0.5) / scale - 0.5 - radius), tf.int32), 0)
    hi = tf.minimum(tf.cast(tf.math.ceil((first + image_size - 0.5) / scale - 0.5 + radius),
                            tf.int32) + 1, hw)
    return scale, offset, flip, lo, hi


def _resize_window(window, plan, image_size: int) -> tf.Tensor:
    """The crop of `_crop_plan` from its window (uint8 or float, (h', w', C)): float32 on the
    window's scale (0-255 for uint8), equal to resizing the whole image and cropping it (the
    same antialiased triangle kernel, `ScaleAndTranslate`, on only the pixels it reads)."""
    scale, offset, flip, lo, _ = plan
    translation = tf.cast(lo, tf.float32) * scale - tf.cast(offset, tf.float32)
    crop = tf.raw_ops.ScaleAndTranslate(
        images=window[None], size=tf.constant([image_size, image_size]), scale=scale,
        translation=translation, kernel_type="triangle", antialias=True)[0]
    crop = tf.cond(flip, lambda: tf.reverse(crop, [1]), lambda: crop)
    return tf.ensure_shape(crop, [image_size, image_size, window.shape[-1]])


def resize_crop(image, seed, image_size: int, random: bool) -> tf.Tensor:
    """ImageNet protocol for one image: resize shorter side to ``image_size * 256 / 224``, then a
    random ``image_size`` crop and flip (``random``) or the centre crop; (S, S, 3) float32 in
    [0, 1]. Only the crop's window is resized (`_crop_plan`): the same pixels as resizing the
    whole image (`resize_shorter_side`) and cropping it, at a fraction of the cost."""
    image = tf.convert_to_tensor(image)
    plan = _crop_plan(tf.shape(image)[:2], seed, image_size, random)
    lo, hi = plan[3], plan[4]
    crop = _resize_window(image[lo[0]:hi[0], lo[1]:hi[1]], plan, image_size)
    return tf.clip_by_value(crop / 255.0 if image.dtype == tf.uint8 else crop, 0.0, 1.0)


def decode_resize_crop(contents, seed, image_size: int, random: bool,
                       dtype: tf.DType = tf.float32) -> tf.Tensor:
    """An encoded image (JPEG, PNG, GIF, BMP bytes) -> its `resize_crop`, decoding only what the
    crop needs: a JPEG's window alone (``decode_and_crop_jpeg``: the rows below it are never
    decoded, the columns beside it skip the inverse DCT); other formats are decoded whole, then
    windowed. ``dtype``: float32 in [0, 1], or uint8 (rounded) for pairs made on the device."""
    contents = tf.convert_to_tensor(contents)

    def jpeg():
        plan = _crop_plan(tf.image.extract_jpeg_shape(contents)[:2], seed, image_size, random)
        lo, hi = plan[3], plan[4]
        window = tf.io.decode_and_crop_jpeg(contents, tf.concat([lo, hi - lo], 0), channels=3,
                                            dct_method=JPEG_DCT)
        return _resize_window(window, plan, image_size)

    def other():
        image = decode_rgb(contents)
        plan = _crop_plan(tf.shape(image)[:2], seed, image_size, random)
        lo, hi = plan[3], plan[4]
        return _resize_window(image[lo[0]:hi[0], lo[1]:hi[1]], plan, image_size)

    crop = tf.clip_by_value(tf.cond(tf.io.is_jpeg(contents), jpeg, other), 0.0, 255.0)
    if dtype == tf.uint8:
        return tf.cast(tf.round(crop), tf.uint8)
    return crop / 255.0
