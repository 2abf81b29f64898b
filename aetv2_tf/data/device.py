"""AET homographies on the device: sampling, warping and pretext pairs in ``keras.ops``.

The same protocol as :mod:`aetv2_tf.data.homographies` (REFERENCE.md section 2), written once
with ``keras.ops`` / ``keras.random`` so that it runs inside a jitted train step on any Keras
backend (TensorFlow, JAX); this module never imports TensorFlow. Frames and directions follow
``docs/conventions.md``:

* pixel centres sit at integer coordinates, pixel ``(row i, column j)`` is the point ``(x=j, y=i)``;
* the *model frame* is centred and normalised, ``u = (x - (W-1)/2) / (W/2)``, so the image is the
  square ``[-1, 1]^2`` whose corners are the outer pixel edges;
* ``T`` (model frame) maps the ORIGINAL image to the TRANSFORMED one: output pixel ``q`` of
  ``t(x)`` samples ``x`` at ``T^{-1} q``; ``cv2.warpPerspective(x, N^{-1} T N, (W, H))`` agrees.
* ``k`` counts counter-clockwise quarter turns (``np.rot90(x, k)``), realised by the sampler as a
  cyclic shift of the corner list (top-left, top-right, bottom-right, bottom-left).

Randomness: every public sampler draws ONE ``keras.random.uniform`` block per call, from a
``seed`` that is a Python int (a fixed stateless seed: the same samples every call) or a
``keras.random.SeedGenerator`` (advanced once per call; a Keras variable, so it is updated inside
a jitted train step and saved in checkpoints). An int seed ``s`` gives the same samples as the
first call with ``SeedGenerator(s)``. The draws differ from the TensorFlow sampler's (another RNG);
the distribution is the same.

Numerics are float32 throughout (JAX disables float64 by default): the 4-point homography is the
closed-form square-to-quad construction in the centred frame (entries O(1), no linear solve), the
inverse is an explicit adjugate, and 3x3 products are written out elementwise (no matmul, hence no
reduced-precision TF32 matmuls on GPUs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
from keras import ops

from aetv2_tf.data.constants import AETV1_FILL, CIFAR10_MEAN, CIFAR10_STD

#: Model-frame image corners (u, v): top-left, top-right, bottom-right, bottom-left.
_CORNER_U = (-1.0, 1.0, 1.0, -1.0)
_CORNER_V = (-1.0, -1.0, 1.0, 1.0)
_SHIFTS = ("integer", "continuous")
_HOMOGRAPHY_UNIFORMS = 10  # scale, rotation, 4 x-shifts, 4 y-shifts
_AUGMENT_UNIFORMS = 3  # crop row offset, crop column offset, flip
_STATE_KEY = "seed_generator_state"

#: A tensor of the active Keras backend (tf.Tensor, jax.Array, ...) or anything convertible to one.
Tensor = Any


def square_to_quad(quad_u: Tensor, quad_v: Tensor) -> Tensor:
    """Homographies mapping the model-frame square onto quadrilaterals, in closed form.

    Args:
      quad_u, quad_v: (..., 4) model-frame coordinates of where the canonical corners
        (top-left, top-right, bottom-right, bottom-left, i.e. ``(-1,-1), (1,-1), (1,1), (-1,1)``)
        go; float32 (float64 works too, and keeps its precision).

    Returns (..., 3, 3) ``T`` in the input's dtype with ``T[..., 2, 2] == 1``: the projective map
    of the unit square onto the quad (Heckbert), composed with ``[-1, 1]^2 -> [0, 1]^2``. Every
    intermediate is O(1) for the sampler's quads, so float32 is accurate to a few ulps (see the
    tests).
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
    rotation, 4 x-shifts, 4 y-shifts): see `sample_homography_components`. The one copy of the
    sampler's mathematics: the tf.data pipelines draw ``u`` with TensorFlow's stateless RNG
    (`homographies.sample_homography_components`), the device with ``keras.random``."""
    if shift not in _SHIFTS:
        raise ValueError(f"shift must be one of {_SHIFTS}, got {shift!r}")
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


def sample_homography_components(
    batch_size: int,
    height: int,
    width: int,
    seed: int | keras.random.SeedGenerator,
    shift: str = "integer",
    scale_range: Sequence[float] = (0.8, 1.2),
    shift_fraction: float = 0.125,
) -> dict[str, Tensor]:
    """The AETv1 sampler with its random components, as ``homographies`` has it.

    Per sample: scale ``s ~ U(scale_range)`` about the centre, ``k ~ U{0..3}`` counter-clockwise
    quarter turns (cyclic shift of the corner list), and independent shifts of the 8 corner
    coordinates: ``"integer"`` whole pixels in ``U{-m..m}``, ``m = round(shift_fraction * side)``
    (4 px for 32), or ``"continuous"`` ``U(-1, 1) * shift_fraction * side`` pixels.

    Returns a dict: ``matrix`` (B, 3, 3) float32 model-frame ``T`` with ``T[2, 2] = 1``,
    ``rotation`` (B,) int32 ``k``, ``scale`` (B,) float32, ``shift`` (B, 4, 2) float32 pixel
    shifts (x, y) of the corners, ``corners`` (B, 4, 2) float32 model-frame moved corners.
    """
    u = keras.random.uniform((batch_size, _HOMOGRAPHY_UNIFORMS), dtype="float32", seed=seed)
    return components_from_uniform(u, height, width, shift, scale_range, shift_fraction)


def sample_homographies(
    batch_size: int,
    height: int,
    width: int,
    seed: int | keras.random.SeedGenerator,
    shift: str = "integer",
    scale_range: Sequence[float] = (0.8, 1.2),
    shift_fraction: float = 0.125,
) -> tuple[Tensor, Tensor]:
    """AETv1 homographies: ``(T (B, 3, 3) float32 model frame with T[2, 2] = 1, k (B,) int32)``.

    ``k`` counts counter-clockwise quarter turns. See :func:`sample_homography_components`.
    """
    parts = sample_homography_components(batch_size, height, width, seed, shift, scale_range,
                                         shift_fraction)
    return parts["matrix"], parts["rotation"]


def matrix_to_params(t: Tensor) -> Tensor:
    """(B, 3, 3) -> (B, 8): row-major entries of ``T / T[2, 2]`` without the last one."""
    flat = ops.reshape(t, (-1, 9))
    return flat[:, :8] / flat[:, 8:]


def _adjugate(t) -> list[list]:
    """Adjugate ``det(T) T^{-1}`` of (B, 3, 3) as nested lists of (B,) entries."""
    a, b, c, d, e, f, g, h, i = (t[:, r, s] for r in range(3) for s in range(3))
    return [[e * i - f * h, c * h - b * i, b * f - c * e],
            [f * g - d * i, a * i - c * g, c * d - a * f],
            [d * h - e * g, b * g - a * h, a * e - b * d]]


def _sample(images, rows, cols, order: int, fill_value: float):
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


def _as_float(images):
    images = ops.convert_to_tensor(images)
    if keras.backend.standardize_dtype(images.dtype) == "uint8":
        return ops.cast(images, "float32") / 255.0
    return ops.cast(images, "float32")


def warp(images: Tensor, t: Tensor, fill_value: float = 0.5) -> Tensor:
    """t(x): bilinear projective warp of a batch by model-frame homographies.

    Args:
      images: (B, H, W, C) float images (uint8 is read as ``/ 255``), static H, W, C.
      t: (B, 3, 3) model-frame ``T`` (original -> transformed, conventions.md), any scale.
      fill_value: the value of taps outside the input (AETv1's grey is ``AETV1_FILL``).

    Returns (B, H, W, C) float32: output pixel ``q`` samples the input bilinearly at
    ``N^{-1} T^{-1} N q`` (``T^{-1}`` as the adjugate, pixel centres at integers); equals
    ``cv2.warpPerspective(x, N^{-1} T N, (W, H))`` with ``BORDER_CONSTANT`` up to float rounding,
    and ``np.rot90(x, k)`` exactly for the quarter turns of square images.
    """
    images = _as_float(images)
    height, width = images.shape[1], images.shape[2]
    if height is None or width is None:
        raise ValueError("warp needs a static image height and width")
    adj = _adjugate(ops.cast(t, "float32"))
    x = ops.arange(width, dtype="float32")[None, None, :]
    y = ops.arange(height, dtype="float32")[None, :, None]
    u = (2.0 * x - (width - 1.0)) / width  # model frame (exact for powers of two)
    v = (2.0 * y - (height - 1.0)) / height

    def row(r):
        a0, a1, a2 = (entry[:, None, None] for entry in adj[r])
        return a0 * u + a1 * v + a2

    den = row(2)
    den = ops.where(ops.abs(den) > 1e-20, den, 1e-20)  # the horizon: cv2 maps it to (0, 0)
    # Back to pixels; points far outside are clipped to where every tap reads the fill.
    src_x = ops.clip(row(0) / den * (width / 2.0) + (width - 1.0) / 2.0, -2.0, width + 1.0)
    src_y = ops.clip(row(1) / den * (height / 2.0) + (height - 1.0) / 2.0, -2.0, height + 1.0)
    return _sample(images, src_y, src_x, 1, fill_value)


def _pad_crop_flip(images, u, pad: int):
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
    return _sample(images, rows, cols, 0, 0.0)


class _SeededLayer(keras.layers.Layer):
    """A layer with its own ``keras.random.SeedGenerator`` (``self.seed_generator``), whose
    state it also saves (Keras does not, by default) in ``.keras`` and ``.weights.h5`` files, so
    that a restored layer continues the stream."""

    def save_own_variables(self, store) -> None:
        super().save_own_variables(store)
        store[_STATE_KEY] = self.seed_generator.state

    def load_own_variables(self, store) -> None:
        if _STATE_KEY in store.keys():
            self.seed_generator.state.assign(ops.convert_to_tensor(
                store[_STATE_KEY], self.seed_generator.state.dtype))


@keras.saving.register_keras_serializable(package="aetv2_tf")
class HomographyPairs(_SeededLayer):
    """AET pretext pairs on the device: images -> ``(x, tx, params)``.

    Input: (B, H, W, 3) uint8 images or float images in ``[0, 1]``, static H, W.
    Output (all float32):

    * ``x`` (B, H, W, 3): the image after the AETv1 pre-augmentation (random crop of the image
      zero-padded by ``H // 8`` px, then a random horizontal flip; ``augment=False`` skips it),
      normalised ``(x - mean) / std``;
    * ``tx`` (B, H, W, 3): ``warp(x, T, fill_value)`` before normalisation, then normalised;
    * ``params`` (B, 8): the 8 parameters of the model-frame ``T`` (conventions.md).

    Randomness comes from one ``keras.random.SeedGenerator(seed)`` owned by the layer, advanced
    once per call (also in inference): every train step draws new crops and homographies, and
    equal seeds give equal streams. The state is a Keras variable: ``model.fit`` (and
    ``stateless_call`` under JAX) carry it through the jitted step; a plain ``jax.jit`` of the
    layer does not advance it. It is saved with ``model.save`` / ``save_weights``, but NOT by
    ``tf.train.Checkpoint(model=...)``, which skips Keras seed generators: add
    ``layer.seed_generator.state`` to such a checkpoint explicitly.
    """

    def __init__(self, seed: int | None = None, shift: str = "integer",
                 scale_range: Sequence[float] = (0.8, 1.2), shift_fraction: float = 0.125,
                 fill_value: float = AETV1_FILL, augment: bool = True,
                 mean: Sequence[float] = CIFAR10_MEAN, std: Sequence[float] = CIFAR10_STD,
                 **kwargs):
        super().__init__(**kwargs)
        if shift not in _SHIFTS:
            raise ValueError(f"shift must be one of {_SHIFTS}, got {shift!r}")
        self.seed = seed
        self.shift = shift
        self.scale_range = tuple(float(s) for s in scale_range)
        self.shift_fraction = float(shift_fraction)
        self.fill_value = float(fill_value)
        self.augment = bool(augment)
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, images: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        images = _as_float(images)
        height, width = images.shape[1], images.shape[2]
        count = _HOMOGRAPHY_UNIFORMS + _AUGMENT_UNIFORMS
        u = keras.random.uniform((ops.shape(images)[0], count), dtype="float32",
                                 seed=self.seed_generator)
        x = _pad_crop_flip(images, u[:, _HOMOGRAPHY_UNIFORMS:], height // 8) if self.augment \
            else images
        parts = components_from_uniform(u[:, :_HOMOGRAPHY_UNIFORMS], height, width, self.shift,
                                         self.scale_range, self.shift_fraction)
        tx = warp(x, parts["matrix"], self.fill_value)
        mean = ops.convert_to_tensor(self.mean, "float32")
        std = ops.convert_to_tensor(self.std, "float32")
        return (x - mean) / std, (tx - mean) / std, matrix_to_params(parts["matrix"])

    def compute_output_spec(self, images):
        shape = tuple(images.shape)
        return (keras.KerasTensor(shape, "float32"), keras.KerasTensor(shape, "float32"),
                keras.KerasTensor((shape[0], 8), "float32"))

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(seed=self.seed, shift=self.shift, scale_range=list(self.scale_range),
                      shift_fraction=self.shift_fraction, fill_value=self.fill_value,
                      augment=self.augment, mean=list(self.mean), std=list(self.std))
        return config


def rot90(images: Tensor) -> Tensor:
    """A quarter turn counter-clockwise of ``(B, H, W, C)`` images (``np.rot90(image, 1)``)."""
    return ops.flip(ops.transpose(images, (0, 2, 1, 3)), axis=1)


class _Augmenting(_SeededLayer):
    """The AETv1 pre-augmentation (``augment``: random crop of the image zero-padded by
    ``H // 8`` px, random horizontal flip; from the layer's seed generator) and the
    normalisation ``(x - mean) / std`` of ``(B, H, W, 3)`` uint8 or ``[0, 1]`` float images."""

    def __init__(self, seed: int | None = None, augment: bool = True,
                 mean: Sequence[float] = CIFAR10_MEAN, std: Sequence[float] = CIFAR10_STD,
                 **kwargs):
        super().__init__(**kwargs)
        self.seed, self.augment = seed, bool(augment)
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.seed_generator = keras.random.SeedGenerator(seed)

    def augmented(self, images: Tensor, augment: bool) -> Tensor:
        """(B, H, W, 3) -> float32 normalised, pre-augmented when ``augment``."""
        images = _as_float(images)
        if augment:
            u = keras.random.uniform((ops.shape(images)[0], _AUGMENT_UNIFORMS),
                                     dtype="float32", seed=self.seed_generator)
            images = _pad_crop_flip(images, u, images.shape[1] // 8)
        return (images - ops.convert_to_tensor(self.mean, "float32")) \
            / ops.convert_to_tensor(self.std, "float32")

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(seed=self.seed, augment=self.augment, mean=list(self.mean),
                      std=list(self.std))
        return config


@keras.saving.register_keras_serializable(package="aetv2_tf")
class ClassifierInputs(_Augmenting):
    """The probes' batches on the device, as ``pipelines.classification_dataset`` makes them:
    ``(B, H, W, 3)`` uint8 -> float32 normalised, pre-augmented in training when ``augment``."""

    def call(self, images: Tensor, training: bool | None = None) -> Tensor:
        return self.augmented(images, self.augment and bool(training))

    def compute_output_spec(self, images, training=None):
        return keras.KerasTensor(tuple(images.shape), "float32")


@keras.saving.register_keras_serializable(package="aetv2_tf")
class QuarterTurns(_Augmenting):
    """RotNet pretext batches on the device: images ``(B, H, W, 3)`` -> ``(x, k)``, as
    ``pipelines.rotation_dataset`` makes them: the B images after the AETv1 pre-augmentation
    (``augment``, from the layer's seed generator), normalised, in rotation 0, then 1, 2, 3
    (``np.rot90(image, k)``): ``x (4B, H, W, 3)`` float32, ``k (4B,)`` float32 labels."""

    def call(self, images: Tensor) -> tuple[Tensor, Tensor]:
        x = self.augmented(images, self.augment)
        turns = [x]
        for _ in range(3):
            turns.append(rot90(turns[-1]))
        labels = ops.repeat(ops.arange(4, dtype="float32"), ops.shape(x)[0])
        return ops.concatenate(turns, axis=0), labels

    def compute_output_spec(self, images):
        batch = None if images.shape[0] is None else 4 * images.shape[0]
        return (keras.KerasTensor((batch, *images.shape[1:]), "float32"),
                keras.KerasTensor((batch,), "float32"))
