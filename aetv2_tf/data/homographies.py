"""Homographies of the AET pretext task: the model frame, the AETv1 sampler, warping.

Frames and directions follow ``docs/conventions.md``: the *model frame* is the square
``[-1, 1]^2`` whose corners are the outer pixel edges, ``p_model = N @ p_pixel`` with
``N = normalization_matrix(H, W)``; ``T`` maps points of the original image ``x`` to points of
``t(x)``, and ``H = N^{-1} T N`` (:func:`to_pixel_homography`) reproduces
``cv2.warpPerspective(x, H, (W, H))``. ``k`` counts quarter turns COUNTER-CLOCKWISE on screen
(y points down): ``rotation_matrix(k) = [[c, s, 0], [-s, c, 0], [0, 0, 1]]``,
``c, s = cos(k pi/2), sin(k pi/2)``, warps an image to ``np.rot90(image, k)``.

Every function here is batched TensorFlow, usable inside ``tf.data``; the sampler's mathematics
is `data.sampler`'s ``keras.ops`` code, shared with the device.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from aetv2_tf.data import sampler
from aetv2_tf.data.constants import AETV1_FILL  # noqa: F401 - re-exported
from aetv2_tf.method.geometry import inverse_3x3

#: The image corners in the model frame, (4, 2) as (u, v): top-left, top-right, bottom-right,
#: bottom-left (clockwise on screen, since v points down).
CANONICAL_CORNERS = np.array([[-1.0, -1.0], [1.0, -1.0], [1.0, 1.0], [-1.0, 1.0]])


def normalization_matrix(height: int, width: int, dtype: tf.DType = tf.float32) -> tf.Tensor:
    """N (3, 3): pixel frame (centres at integers) -> model frame (edges at +-1)."""
    return tf.constant([[2.0 / width, 0.0, -(width - 1.0) / width],
                        [0.0, 2.0 / height, -(height - 1.0) / height],
                        [0.0, 0.0, 1.0]], dtype=dtype)


def _denormalization_matrix(height: int, width: int, dtype: tf.DType) -> tf.Tensor:
    """N^{-1} (3, 3): model frame -> pixel frame, written out exactly."""
    return tf.constant([[width / 2.0, 0.0, (width - 1.0) / 2.0],
                        [0.0, height / 2.0, (height - 1.0) / 2.0],
                        [0.0, 0.0, 1.0]], dtype=dtype)


def _as_float_matrix(t) -> tf.Tensor:
    t = tf.convert_to_tensor(t)
    return t if t.dtype in (tf.float32, tf.float64) else tf.cast(t, tf.float32)


def rotation_matrix(k, dtype: tf.DType = tf.float32) -> tf.Tensor:
    """Exact model-frame rotations by ``k`` counter-clockwise quarter turns: (...,) -> (..., 3, 3).

    ``warp(images, rotation_matrix(k))`` equals ``np.rot90(images, k, axes=(1, 2))`` for square
    images (the pixel grid maps onto itself, so nearest and bilinear sampling are both exact).
    """
    k = tf.math.floormod(tf.cast(k, tf.int32), 4)
    c = tf.gather(tf.constant([1.0, 0.0, -1.0, 0.0], dtype), k)
    s = tf.gather(tf.constant([0.0, 1.0, 0.0, -1.0], dtype), k)
    zero, one = tf.zeros_like(c), tf.ones_like(c)
    rows = [[c, s, zero], [-s, c, zero], [zero, zero, one]]
    return tf.stack([tf.stack(r, -1) for r in rows], axis=-2)


def square_to_quad(quad) -> tf.Tensor:
    """Homographies mapping the model-frame square onto quadrilaterals: (..., 4, 2) -> (..., 3, 3).

    ``quad[..., i, :]`` is where ``CANONICAL_CORNERS[i]`` goes. The closed form of
    `aetv2_tf.data.sampler.square_to_quad` (no linear solve), on a corner array; the result has
    ``T[..., 2, 2] == 1`` and the dtype of ``quad`` (float64 for accuracy).
    """
    quad = tf.convert_to_tensor(quad)
    return sampler.square_to_quad(quad[..., 0], quad[..., 1])


def stateless_seed(seed) -> tf.Tensor:
    """A stateless-RNG seed ``(2,)`` int64 from a Python/NumPy int ``s`` (-> ``(0, s)``) or any
    shape-``(2,)`` integer array or tensor (int32 and int64 seeds with equal values agree)."""
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return tf.constant([0, int(seed)], tf.int64)
    try:
        tensor = tf.convert_to_tensor(seed)
    except (TypeError, ValueError) as e:
        raise ValueError(f"seed must be an int or a shape-(2,) integer tensor, got {seed!r}") from e
    if not tensor.dtype.is_integer or tensor.shape.rank not in (0, 1, None) \
            or (tensor.shape.rank == 1 and tensor.shape[0] not in (2, None)):
        raise ValueError(f"seed must be an int or a shape-(2,) integer tensor (a stateless "
                         f"seed such as (0, 7)), got {tensor.dtype.name} of shape {tensor.shape}")
    tensor = tf.cast(tensor, tf.int64)
    if tensor.shape.rank == 0:
        return tf.stack([tf.zeros_like(tensor), tensor])
    return tensor


def sample_homography_components(batch_size, height: int, width: int, seed,
                                 shift: str = "integer",
                                 scale_range: Sequence[float] = (0.8, 1.2),
                                 shift_fraction: float = 0.125) -> dict[str, tf.Tensor]:
    """The AETv1 sampler of `data.sampler.sample_homography_components` (the protocol and the
    returned dict), its ``(B, 10)`` uniforms drawn by TensorFlow's stateless RNG from ``seed``
    (`stateless_seed`): equal seeds give equal samples, so a resumed pipeline redraws the same
    homographies. ``batch_size``: B, an int or a scalar int tensor."""
    import keras

    if keras.backend.backend() != "tensorflow":
        raise RuntimeError("aetv2_tf.data.homographies samples with keras.ops, which are "
                           "TensorFlow ops only under KERAS_BACKEND=tensorflow; on another "
                           "backend use aetv2_tf.data.sampler (the same sampler).")
    u = tf.random.stateless_uniform(tf.stack([tf.cast(batch_size, tf.int32), 10]),
                                    stateless_seed(seed), dtype=tf.float32)
    return sampler.components_from_uniform(u, height, width, shift, scale_range, shift_fraction)


def sample_homographies(batch_size, height: int, width: int, seed, shift: str = "integer",
                        scale_range: Sequence[float] = (0.8, 1.2), shift_fraction: float = 0.125,
                        return_rotation: bool = False):
    """AETv1 homographies ``T`` (B, 3, 3) float32 in the model frame, ``T[2, 2] = 1``
    (:func:`sample_homography_components`); with ``return_rotation``, ``(T, k)``, ``k`` (B,)
    int32 counter-clockwise quarter turns."""
    parts = sample_homography_components(batch_size, height, width, seed, shift, scale_range,
                                         shift_fraction)
    return (parts["matrix"], parts["rotation"]) if return_rotation else parts["matrix"]


def to_pixel_homography(t, height: int, width: int) -> tf.Tensor:
    """H = N^{-1} T N (..., 3, 3): the model-frame ``T`` acting on pixel coordinates.

    ``cv2.warpPerspective(x, H, (W, H))`` (no ``WARP_INVERSE_MAP``) produces ``t(x)``. H is not
    rescaled, so ``H[2, 2]`` need not be 1 (homogeneous; any scale is the same map).
    """
    t = _as_float_matrix(t)
    n = normalization_matrix(height, width, t.dtype)
    return _denormalization_matrix(height, width, t.dtype) @ t @ n


def corners(t, height: int = 32, width: int | None = None) -> tf.Tensor:
    """Where ``t`` moves the 4 image corners, in pixel coordinates: (..., 3, 3) -> (..., 4, 2).

    The corners are the outer pixel edges ``(-0.5, -0.5), (W-0.5, -0.5), (W-0.5, H-0.5),
    (-0.5, H-0.5)`` (top-left, top-right, bottom-right, bottom-left of the ORIGINAL image), given
    as (x, y) pixel points of ``t(x)``: the quadrilateral outlining the warped image.
    """
    width = height if width is None else width
    t = _as_float_matrix(t)
    canonical = tf.constant(np.concatenate([CANONICAL_CORNERS, np.ones((4, 1))], 1), t.dtype)
    moved = tf.linalg.matvec(t[..., None, :, :], canonical)  # (..., 4, 3) model frame
    uv = moved[..., :2] / moved[..., 2:3]
    scale = tf.constant([width / 2.0, height / 2.0], t.dtype)
    offset = tf.constant([(width - 1.0) / 2.0, (height - 1.0) / 2.0], t.dtype)
    return uv * scale + offset


def warp(images, t, fill_value: float = 0.5, interpolation: str = "bilinear") -> tf.Tensor:
    """t(x): images (B, H, W, C) float32 (or float64/uint8) warped by model-frame ``T`` (B, 3, 3)
    (original -> transformed), ``"bilinear"`` or ``"nearest"``.

    Returns (B, H, W, C) of the images' dtype: output pixel ``q`` samples the input at
    ``H^{-1} q`` (``ImageProjectiveTransformV3``); taps outside the image read ``fill_value``
    (default 0.5; AETv1's grey is ``AETV1_FILL = 128/255``), like ``cv2.BORDER_CONSTANT``.
    """
    images = tf.convert_to_tensor(images)
    height, width = images.shape[1], images.shape[2]
    if height is None or width is None:
        raise ValueError("warp needs a static image height and width")
    t = tf.cast(_as_float_matrix(t), tf.float64)
    inverse = to_pixel_homography(inverse_3x3(t), height, width)
    inverse = inverse / inverse[..., 2:3, 2:3]
    transforms = tf.cast(tf.reshape(inverse, [-1, 9])[:, :8], tf.float32)
    return tf.raw_ops.ImageProjectiveTransformV3(
        images=images, transforms=transforms, output_shape=tf.constant([height, width], tf.int32),
        fill_value=tf.constant(fill_value, tf.float32), interpolation=interpolation.upper(),
        fill_mode="CONSTANT")
