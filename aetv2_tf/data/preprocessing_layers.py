"""The device's preprocessing layers: uint8 image batches -> the pretext (`HomographyPairs`,
`QuarterTurns`) and probe (`ClassifierInputs`) inputs, made inside the compiled train step from
each layer's own seeded random stream (any Keras backend), its state saved with its weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
from keras import ops

from aetv2_tf.data.constants import AETV1_FILL, CIFAR10_MEAN, CIFAR10_STD
from aetv2_tf.data.sampler import HOMOGRAPHY_UNIFORMS, SHIFTS, components_from_uniform
from aetv2_tf.data.warping import as_float, pad_crop_flip, rot90, warp
from aetv2_tf.method.geometry import matrix_to_params

_AUGMENT_UNIFORMS = 3  # crop row offset, crop column offset, flip
_STATE_KEY = "seed_generator_state"

Tensor = Any


class _SeededLayer(keras.layers.Layer):
    """A layer with its own ``keras.random.SeedGenerator`` (``self.seed_generator``), whose
    state it saves in ``.keras`` and ``.weights.h5`` files (Keras does not, by default)."""

    def save_own_variables(self, store) -> None:
        super().save_own_variables(store)
        store[_STATE_KEY] = self.seed_generator.state

    def load_own_variables(self, store) -> None:
        if _STATE_KEY in store.keys():
            self.seed_generator.state.assign(ops.convert_to_tensor(
                store[_STATE_KEY], self.seed_generator.state.dtype))


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

    def normalised(self, images: Tensor) -> Tensor:
        return (images - ops.convert_to_tensor(self.mean, "float32")) \
            / ops.convert_to_tensor(self.std, "float32")

    def augmented(self, images: Tensor, augment: bool) -> Tensor:
        """(B, H, W, 3) -> float32 normalised, pre-augmented when ``augment``."""
        images = as_float(images)
        if augment:
            u = keras.random.uniform((ops.shape(images)[0], _AUGMENT_UNIFORMS),
                                     dtype="float32", seed=self.seed_generator)
            images = pad_crop_flip(images, u, images.shape[1] // 8)
        return self.normalised(images)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(seed=self.seed, augment=self.augment, mean=list(self.mean),
                      std=list(self.std))
        return config


@keras.saving.register_keras_serializable(package="aetv2_tf")
class HomographyPairs(_Augmenting):
    """AET pretext pairs on the device: images -> ``(x, tx, params)``.

    Input: (B, H, W, 3) uint8 images or float images in ``[0, 1]``, static H, W.
    Output (all float32): ``x`` (B, H, W, 3), the image after the AETv1 pre-augmentation
    (``augment``), normalised; ``tx`` (B, H, W, 3), ``warp(x, T, fill_value)`` normalised;
    ``params`` (B, 8), the 8 parameters of the model-frame ``T`` (conventions.md).

    One block of uniforms per call (also in inference) from the layer's seed generator, a Keras
    variable carried by ``model.fit`` and ``stateless_call`` (not by a plain ``jax.jit``) and
    saved by ``model.save`` / ``save_weights``, NOT by ``tf.train.Checkpoint(model=...)``: add
    ``layer.seed_generator.state`` to such a checkpoint.
    """

    def __init__(self, seed: int | None = None, shift: str = "integer",
                 scale_range: Sequence[float] = (0.8, 1.2), shift_fraction: float = 0.125,
                 fill_value: float = AETV1_FILL, augment: bool = True,
                 mean: Sequence[float] = CIFAR10_MEAN, std: Sequence[float] = CIFAR10_STD,
                 **kwargs):
        super().__init__(seed, augment, mean, std, **kwargs)
        if shift not in SHIFTS:
            raise ValueError(f"shift must be one of {SHIFTS}, got {shift!r}")
        self.shift = shift
        self.scale_range = tuple(float(s) for s in scale_range)
        self.shift_fraction = float(shift_fraction)
        self.fill_value = float(fill_value)

    def call(self, images: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        images = as_float(images)
        height, width = images.shape[1], images.shape[2]
        count = HOMOGRAPHY_UNIFORMS + _AUGMENT_UNIFORMS
        u = keras.random.uniform((ops.shape(images)[0], count), dtype="float32",
                                 seed=self.seed_generator)
        x = pad_crop_flip(images, u[:, HOMOGRAPHY_UNIFORMS:], height // 8) if self.augment \
            else images
        parts = components_from_uniform(u[:, :HOMOGRAPHY_UNIFORMS], height, width, self.shift,
                                         self.scale_range, self.shift_fraction)
        tx = warp(x, parts["matrix"], self.fill_value)
        return self.normalised(x), self.normalised(tx), matrix_to_params(parts["matrix"])

    def compute_output_spec(self, images):
        shape = tuple(images.shape)
        return (keras.KerasTensor(shape, "float32"), keras.KerasTensor(shape, "float32"),
                keras.KerasTensor((shape[0], 8), "float32"))

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(shift=self.shift, scale_range=list(self.scale_range),
                      shift_fraction=self.shift_fraction, fill_value=self.fill_value)
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
