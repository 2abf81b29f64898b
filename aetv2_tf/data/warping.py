"""Warps and crops of image batches on the device, in ``keras.ops`` (any Keras backend).

Frames and directions follow ``docs/conventions.md``: pixel centres sit at integer coordinates,
pixel ``(row i, column j)`` is the point ``(x=j, y=i)``; output pixel ``q`` of ``t(x)`` samples
``x`` at ``T^{-1} q`` (``T`` in the model frame); ``cv2.warpPerspective(x, N^{-1} T N, (W, H))``
agrees. The inverse is the explicit adjugate (`geometry.adjugate_3x3`) and 3x3 products are
written out elementwise (no matmul, hence no reduced-precision TF32 matmuls on GPUs).
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from aetv2_tf.method.geometry import adjugate_3x3

Tensor = Any


def sample_points(images, rows, cols, order: int, fill_value: float):
    """Per-image ``map_coordinates``: images (B, H, W, C) at float points (B, Ho, Wo) -> (B, Ho,
    Wo, C). Taps outside the image read ``fill_value`` (per tap, like cv2.BORDER_CONSTANT).

    The batch becomes one more (integer, hence exact) coordinate of a (B * C, H, W) stack; a batch
    size unknown when tracing (a TF graph) maps the images one by one (``vectorized_map``)."""
    batch, channels = images.shape[0], images.shape[-1]
    out_shape = tuple(rows.shape[1:])

    def planes_at(stack, plane, r, c):  # stack (P, H, W); plane, r, c (P, Ho, Wo)
        coordinates = ops.stack([plane, r, c])
        return ops.image.map_coordinates(stack, coordinates, order, fill_mode="constant",
                                         fill_value=fill_value)

    if batch is None:
        def one(args):
            image, r, c = args  # (H, W, C), (Ho, Wo), (Ho, Wo)
            plane = ops.broadcast_to(ops.reshape(ops.arange(channels, dtype="float32"),
                                                 (channels, 1, 1)), (channels,) + out_shape)
            stack = ops.transpose(image, (2, 0, 1))
            out = planes_at(stack, plane, ops.broadcast_to(r[None], plane.shape),
                            ops.broadcast_to(c[None], plane.shape))
            return ops.transpose(out, (1, 2, 0))

        return ops.vectorized_map(one, (images, rows, cols))
    count = batch * channels
    stack = ops.reshape(ops.transpose(images, (0, 3, 1, 2)), (count,) + tuple(images.shape[1:3]))
    plane = ops.broadcast_to(ops.reshape(ops.arange(count, dtype="float32"), (count, 1, 1)),
                             (count,) + out_shape)
    shape = (batch, channels) + out_shape
    r = ops.reshape(ops.broadcast_to(rows[:, None], shape), plane.shape)
    c = ops.reshape(ops.broadcast_to(cols[:, None], shape), plane.shape)
    out = ops.reshape(planes_at(stack, plane, r, c), shape)
    return ops.transpose(out, (0, 2, 3, 1))


def as_float(images):
    images = ops.convert_to_tensor(images)
    if keras.backend.standardize_dtype(images.dtype) == "uint8":
        return ops.cast(images, "float32") / 255.0
    return ops.cast(images, "float32")


def warp(images: Tensor, t: Tensor, fill_value: float = 0.5) -> Tensor:
    """t(x): images (B, H, W, C) float (uint8 read as ``/ 255``; static H, W, C) warped
    bilinearly by model-frame ``T`` (B, 3, 3) (original -> transformed, any scale).

    Returns (B, H, W, C) float32: output pixel ``q`` samples the input at ``N^{-1} T^{-1} N q``
    (taps outside read ``fill_value``); equals ``cv2.warpPerspective(x, N^{-1} T N, (W, H))``
    with ``BORDER_CONSTANT`` up to float rounding, and ``np.rot90(x, k)`` exactly for the
    quarter turns of square images.
    """
    images = as_float(images)
    height, width = images.shape[1], images.shape[2]
    if height is None or width is None:
        raise ValueError("warp needs a static image height and width")
    adj = adjugate_3x3(ops.cast(t, "float32"))[0]
    x = ops.arange(width, dtype="float32")[None, None, :]
    y = ops.arange(height, dtype="float32")[None, :, None]
    u = (2.0 * x - (width - 1.0)) / width  # model frame (exact for powers of two)
    v = (2.0 * y - (height - 1.0)) / height

    def row(r):
        a0, a1, a2 = (adj[:, r, s, None, None] for s in range(3))
        return a0 * u + a1 * v + a2

    den = row(2)
    den = ops.where(ops.abs(den) > 1e-20, den, 1e-20)  # the horizon: cv2 maps it to (0, 0)
    # Back to pixels; points far outside are clipped to where every tap reads the fill.
    src_x = ops.clip(row(0) / den * (width / 2.0) + (width - 1.0) / 2.0, -2.0, width + 1.0)
    src_y = ops.clip(row(1) / den * (height / 2.0) + (height - 1.0) / 2.0, -2.0, height + 1.0)
    return sample_points(images, src_y, src_x, 1, fill_value)


def pad_crop_flip(images, u, pad: int):
    """AETv1 pre-augmentation: random crop of the ``pad``-px ZERO-padded image, random horizontal
    flip (as ``pipelines.pad_crop_flip``); u (B, 3) uniforms. Exact (integer nearest sampling)."""
    height, width = images.shape[1], images.shape[2]
    offset_y = ops.clip(ops.floor((2 * pad + 1) * u[:, 0]), 0.0, 2.0 * pad) - pad
    offset_x = ops.clip(ops.floor((2 * pad + 1) * u[:, 1]), 0.0, 2.0 * pad) - pad
    flip = u[:, 2] >= 0.5
    y = ops.arange(height, dtype="float32")[None, :, None]
    x = ops.arange(width, dtype="float32")[None, None, :]
    x = ops.where(flip[:, None, None], (width - 1.0) - x, x)
    rows = y + offset_y[:, None, None] + ops.zeros_like(x)  # (B, H, W)
    cols = x + offset_x[:, None, None] + ops.zeros_like(y)
    return sample_points(images, rows, cols, 0, 0.0)


def rot90(images: Tensor) -> Tensor:
    """A quarter turn counter-clockwise of ``(B, H, W, C)`` images (``np.rot90(image, 1)``)."""
    return ops.flip(ops.transpose(images, (0, 2, 1, 3)), axis=1)
