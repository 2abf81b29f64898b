"""The AETv1 homography sampler in ``keras.ops``: the one copy of its mathematics.

It runs inside a jitted train step on any Keras backend (`preprocessing_layers.HomographyPairs`)
and, on uniforms drawn by TensorFlow's stateless RNG, in the tf.data pipelines
(`homographies.sample_homography_components`); it never imports TensorFlow. Frames and
directions follow ``docs/conventions.md``: the model frame ``u = (x - (W-1)/2) / (W/2)`` (the
image is ``[-1, 1]^2``, corners at the outer pixel edges); ``T`` maps the ORIGINAL image to the
TRANSFORMED one; ``k`` counts counter-clockwise quarter turns (``np.rot90(x, k)``), a cyclic
shift of the corner list (top-left, top-right, bottom-right, bottom-left).

A public sampler draws ONE ``keras.random.uniform`` block per call, from an int seed (the same
samples every call; ``s`` gives those of the first call with ``SeedGenerator(s)``) or a
``keras.random.SeedGenerator`` (advanced once per call). Numerics are float32 throughout, the
homography in closed form (entries O(1), no linear solve).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
from keras import ops

from aetv2_tf.method.geometry import matrix_to_params

#: Model-frame image corners (u, v): top-left, top-right, bottom-right, bottom-left.
_CORNER_U = (-1.0, 1.0, 1.0, -1.0)
_CORNER_V = (-1.0, -1.0, 1.0, 1.0)
SHIFTS = ("integer", "continuous")
#: Uniforms a homography takes: scale, rotation, 4 x-shifts, 4 y-shifts.
HOMOGRAPHY_UNIFORMS = 10

#: A tensor of the active Keras backend (tf.Tensor, jax.Array, ...) or anything convertible to one.
Tensor = Any


def square_to_quad(quad_u: Tensor, quad_v: Tensor) -> Tensor:
    """Homographies mapping the model-frame square onto quadrilaterals, in closed form.

    Args:
      quad_u, quad_v: (..., 4) model-frame coordinates of where the canonical corners
        (top-left, top-right, bottom-right, bottom-left, i.e. ``(-1,-1), (1,-1), (1,1), (-1,1)``)
        go; float32 (float64 works too, and keeps its precision).

    Returns (..., 3, 3) ``T`` in the input's dtype with ``T[..., 2, 2] == 1``: the projective map
    of the unit square onto the quad (Heckbert), composed with ``[-1, 1]^2 -> [0, 1]^2`` (every
    intermediate O(1): float32 is accurate to a few ulps).
    """
    x0, x1, x2, x3 = (quad_u[..., i] for i in range(4))
    y0, y1, y2, y3 = (quad_v[..., i] for i in range(4))
    dx1, dx2, sx = x1 - x2, x3 - x2, (x0 - x1) + (x2 - x3)
    dy1, dy2, sy = y1 - y2, y3 - y2, (y0 - y1) + (y2 - y3)
    den = dx1 * dy2 - dx2 * dy1
    g = (sx * dy2 - dx2 * sy) / den
    h = (dx1 * sy - sx * dy1) / den
    # unit-square map [[a, b, c], [d, e, f], [g, h, 1]] ...
    a, b, c = x1 - x0 + g * x1, x3 - x0 + h * x3, x0
    d, e, f = y1 - y0 + g * y1, y3 - y0 + h * y3, y0
    # ... times [[1/2, 0, 1/2], [0, 1/2, 1/2], [0, 0, 1]], divided by its last entry.
    last = 1.0 + 0.5 * (g + h)
    rows = [
        [0.5 * a, 0.5 * b, 0.5 * (a + b) + c],
        [0.5 * d, 0.5 * e, 0.5 * (d + e) + f],
        [0.5 * g, 0.5 * h, last],
    ]
    rows = [[entry / last for entry in row] for row in rows]
    rows[2][2] = ops.ones_like(last)
    return ops.stack([ops.stack(row, axis=-1) for row in rows], axis=-2)


def components_from_uniform(u, height: int, width: int, shift: str,
                            scale_range: Sequence[float], shift_fraction: float) -> dict:
    """The AETv1 sampler as a function of ``u`` (B, 10) float32 uniforms in [0, 1) (scale,
    rotation, 4 x-shifts, 4 y-shifts): see `sample_homography_components`."""
    if shift not in SHIFTS:
        raise ValueError(f"shift must be one of {SHIFTS}, got {shift!r}")
    lo, hi = float(scale_range[0]), float(scale_range[1])
    scale = lo + (hi - lo) * u[:, 0]
    rotation = ops.cast(ops.clip(ops.floor(4.0 * u[:, 1]), 0.0, 3.0), "int32")
    pixel_shift = []
    for columns, side in ((u[:, 2:6], width), (u[:, 6:10], height)):
        if shift == "integer":
            m = int(round(shift_fraction * side))
            d = ops.clip(ops.floor((2 * m + 1) * columns), 0.0, 2.0 * m) - m
        else:
            m = shift_fraction * side
            d = (2.0 * columns - 1.0) * m
        pixel_shift.append(d)
    # Quarter turn k: corner i moves to the place of corner (i - k) mod 4, i.e. the corner list
    # is cyclically shifted: position i now holds the canonical corner (i - k) mod 4.
    source = ops.mod(ops.arange(4, dtype="int32")[None, :] - rotation[:, None], 4)
    rotated_u = ops.take(ops.convert_to_tensor(_CORNER_U, "float32"), source)
    rotated_v = ops.take(ops.convert_to_tensor(_CORNER_V, "float32"), source)
    quad_u = scale[:, None] * rotated_u + pixel_shift[0] * (2.0 / width)
    quad_v = scale[:, None] * rotated_v + pixel_shift[1] * (2.0 / height)
    return {"matrix": square_to_quad(quad_u, quad_v), "rotation": rotation, "scale": scale,
            "shift": ops.stack(pixel_shift, axis=-1), "corners": ops.stack([quad_u, quad_v], -1)}


def sample_homography_components(batch_size: int, height: int, width: int,
                                 seed: int | keras.random.SeedGenerator, shift: str = "integer",
                                 scale_range: Sequence[float] = (0.8, 1.2),
                                 shift_fraction: float = 0.125) -> dict[str, Tensor]:
    """The AETv1 sampler with its random components.

    Per sample: scale ``s ~ U(scale_range)`` about the centre, ``k ~ U{0..3}`` counter-clockwise
    quarter turns (cyclic shift of the corner list), and independent shifts of the 8 corner
    coordinates: ``"integer"`` whole pixels in ``U{-m..m}``, ``m = round(shift_fraction * side)``
    (4 px for 32, 28 px for 224, as AETv1), or ``"continuous"`` ``U(-1, 1) * shift_fraction *
    side`` pixels.

    Returns a dict: ``matrix`` (B, 3, 3) float32 model-frame ``T`` with ``T[2, 2] = 1``,
    ``rotation`` (B,) int32 ``k``, ``scale`` (B,) float32, ``shift`` (B, 4, 2) float32 pixel
    shifts (x, y) of the corners, ``corners`` (B, 4, 2) float32 model-frame moved corners.
    """
    u = keras.random.uniform((batch_size, HOMOGRAPHY_UNIFORMS), dtype="float32", seed=seed)
    return components_from_uniform(u, height, width, shift, scale_range, shift_fraction)


def sample_homographies(batch_size: int, height: int, width: int,
                        seed: int | keras.random.SeedGenerator, shift: str = "integer",
                        scale_range: Sequence[float] = (0.8, 1.2),
                        shift_fraction: float = 0.125) -> tuple[Tensor, Tensor]:
    """AETv1 homographies ``(T (B, 3, 3) float32 model frame with T[2, 2] = 1, k (B,) int32
    counter-clockwise quarter turns)`` of :func:`sample_homography_components`."""
    parts = sample_homography_components(batch_size, height, width, seed, shift, scale_range,
                                         shift_fraction)
    return parts["matrix"], parts["rotation"]


def parameter_std(image_size: int, shift: str = "integer", samples: int = 200_000) -> np.ndarray:
    """(8,) float32 std of the sampler's parameters for ``image_size`` square images (a fixed
    seed, the same numbers on every backend up to its RNG; computed once per process): AETv1's
    normalisation of the regression targets, and the decoder's scale where a recipe asks for it."""
    return _parameter_std(int(image_size), shift, int(samples)).copy()


@functools.lru_cache(maxsize=8)
def _parameter_std(image_size: int, shift: str, samples: int) -> np.ndarray:
    t, _ = sample_homographies(samples, image_size, image_size, 1234, shift)
    params = ops.convert_to_numpy(matrix_to_params(t)).astype(np.float64)
    return params.std(0).astype(np.float32)
