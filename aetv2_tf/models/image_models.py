"""Encoders that carry their preprocessing: a classifier to fine-tune, a feature extractor.

Both take uint8 NHWC images, as stored, and hold everything that turns them into features:

    images (B, H, W, 3) uint8
      -> ClassifierInputs "preprocessing" (data.layers: (u / 255 - mean) / std, float32; mean and
         std in its config; optionally the AETv1 crop-and-flip augmentation in training)
      -> the encoder CUT at `feature` (`cut_encoder`: its layers up to the feature only, weights
         shared with `encoder`)                                   -> (B, h, w, C) or (B, D)
      -> PoolFeatures "pool" (`models.features.pool_feature_map`)     -> (B, D) float32
      -> a head (`build_head`, classifier only)                   -> (B, num_classes) float32

`build_classifier(encoder, 10)` on NIN is the paper's linear probe (block 2, adaptive pooling to
7 x 7 x 192, BatchNorm without affine, Dense) as one model to `fit` end to end; for a FROZEN
encoder set ``classifier.get_layer(encoder.name).trainable = False`` before `compile`. Both are a
`CheckedModel` (inputs checked, `models.checked_inputs`). `feature=None`: the probe feature
(`models.features.classifier_feature`). The normalisation defaults to CIFAR-10's; another
encoder's: ``**aetv2_tf.files.saving.preprocessing(directory_or_preset)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np

from aetv2_tf.data.constants import CIFAR10_MEAN, CIFAR10_STD
from aetv2_tf.data.preprocessing_layers import ClassifierInputs
from aetv2_tf.errors import UsageError
from aetv2_tf.models.checked_inputs import LABELS, ChecksInputs, ChecksNormalisedInputs
from aetv2_tf.models.displayed_loss import ShowsDataLoss
from aetv2_tf.models.features import (  # noqa: F401 - classifier_feature: API
    POOLS,
    Feature,
    classifier_feature,
    cut_encoder,
    pool_feature_map,
)
from aetv2_tf.models.heads import HEAD_KINDS, build_head


@keras.saving.register_keras_serializable(package="aetv2_tf")
class CheckedModel(ChecksInputs, ShowsDataLoss, keras.Model):
    """A functional model on uint8 images ``(B, H, W, 3)`` whose entries check their inputs
    (`models.checked_inputs.ChecksInputs`; ``labels``: "classes" or "any")."""

    def __init__(self, *args, labels: str = "any", **kwargs):
        if labels not in LABELS:
            raise ValueError(f"labels must be one of {LABELS}, got {labels!r}")
        super().__init__(*args, **kwargs)
        self.labels = labels

    def get_config(self) -> dict:
        return {**super().get_config(), "labels": self.labels}


@keras.saving.register_keras_serializable(package="aetv2_tf")
class NormalisedEncoder(ChecksNormalisedInputs, ShowsDataLoss, keras.Model):
    """An encoder on NORMALISED float images ``(u / 255 - mean) / std`` (`saving.load_encoder`'s)
    that refuses raw pixels with the fix (`models.checked_inputs.ChecksNormalisedInputs`)."""


def normalised_encoder(encoder: keras.Model) -> keras.Model:
    """`encoder` as a `NormalisedEncoder` sharing its layers and weights (one without symbolic
    inputs and outputs: itself)."""
    from aetv2_tf.models.features import output_structure

    if isinstance(encoder, NormalisedEncoder):
        return encoder
    try:
        outputs = output_structure(encoder)
        inputs = encoder.inputs[0] if len(encoder.inputs) == 1 else encoder.inputs
    except (ValueError, AttributeError, TypeError):
        return encoder
    return NormalisedEncoder(inputs, outputs, name=encoder.name)


@keras.saving.register_keras_serializable(package="aetv2_tf")
class PoolFeatures(keras.layers.Layer):
    """A feature map ``(B, h, w, C)`` -> float32 vector ``(B, D)`` by `pool_feature_map`."""

    def __init__(self, pool: str = "avg2x2", **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS} or None, got {pool!r}")
        self.pool = pool

    def call(self, inputs):
        return pool_feature_map(inputs, self.pool)

    def compute_output_shape(self, input_shape):
        if len(input_shape) == 2:
            return tuple(input_shape)
        _, h, w, c = input_shape
        if self.pool == "global":
            return (input_shape[0], c)
        if self.pool == "avg2x2":
            h, w = (None if h is None else h // 2), (None if w is None else w // 2)
        size = None if None in (h, w, c) else h * w * c
        return (input_shape[0], size)

    def get_config(self) -> dict:
        return {**super().get_config(), "pool": self.pool}


def _preprocessed(encoder: keras.Model, mean, std, augment: bool, seed: int | None):
    if len(encoder.inputs) != 1 or len(encoder.inputs[0].shape) != 4:
        raise ValueError(f"encoder {encoder.name!r} must take one (B, H, W, C) image input, not "
                         f"{[tuple(x.shape) for x in encoder.inputs]}")
    shape = tuple(encoder.inputs[0].shape[1:])
    if len(mean) != shape[-1] or len(std) != shape[-1]:
        raise ValueError(f"mean {tuple(mean)} and std {tuple(std)} need one value per channel "
                         f"of the {shape} input")
    images = keras.Input(shape=shape, dtype="uint8", name="images")
    x = ClassifierInputs(seed=seed, augment=augment, mean=mean, std=std,
                         name="preprocessing")(images)
    return images, x


def feature_extractor(encoder: keras.Model, feature: Feature = None, *,
                      mean: Sequence[float] = CIFAR10_MEAN, std: Sequence[float] = CIFAR10_STD,
                      pool: str | None = "avg2x2", name: str = "feature_extractor") -> CheckedModel:
    """uint8 images ``(B, H, W, 3)`` -> the `feature` of `encoder`, pooled: a `CheckedModel`
    (``predict`` refuses floats, NCHW or another size, with the fix).

    Args:
        encoder: any encoder of `models.features`; its weights are shared, not copied.
        feature: as `models.features` (None: `classifier_feature`).
        mean, std: per-channel normalisation ``(u / 255 - mean) / std`` (default CIFAR-10's).
        pool: a `pool_feature_map` pooling (default ``"avg2x2"``, the authors' KNN features),
            or None: the feature map itself ``(B, h, w, C)``.
        name: the model's name.

    Returns:
        The model (layers "preprocessing", the cut encoder, "pool"); call it with
        ``training=False`` for features.
    """
    feature = classifier_feature(encoder, feature)
    images, x = _preprocessed(encoder, mean, std, augment=False, seed=None)
    x = cut_encoder(encoder, feature)(x)
    if pool is not None:
        x = PoolFeatures(pool, name="pool")(x)
    return CheckedModel(images, x, name=name)


def build_classifier(encoder: keras.Model, num_classes: int, *, feature: Feature = None,
                     mean: Sequence[float] = CIFAR10_MEAN, std: Sequence[float] = CIFAR10_STD,
                     head: str | keras.layers.Layer = "linear", pool: str | None = None,
                     augment: bool = False, seed: int | None = None, batch_norm: str = "keras",
                     name: str = "classifier") -> CheckedModel:
    """uint8 images ``(B, H, W, 3)`` -> float32 logits ``(B, num_classes)``: the encoder cut at
    `feature`, with its preprocessing and a head (module docstring).

    Args:
        encoder, feature, mean, std: as `feature_extractor`.
        num_classes: the number of logits, a whole number >= 2 (else `errors.UsageError`).
        head: a kind of `build_head` ("linear", the default: "fc1" on a vector) or your own
            Keras layer/model, called on the (pooled) feature.
        pool: None (the head takes the map) or a `PoolFeatures` pooling before the head.
        augment, seed: the AETv1 crop-and-flip augmentation in training (`ClassifierInputs`).
        batch_norm: the head's BatchNorm, "keras" (any backend) or "fused" (TensorFlow).
        name: the model's name.

    Returns:
        A `CheckedModel` (``labels="classes"``): layers "preprocessing", the cut encoder,
        "pool" when `pool` is given, the head (last layer "logits").
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or \
            num_classes < 2:
        raise UsageError(f"build_classifier: num_classes={num_classes!r}; a classifier needs a "
                         "whole number of at least 2 classes (its logits), e.g. 10 for CIFAR-10")
    feature = classifier_feature(encoder, feature)
    images, x = _preprocessed(encoder, mean, std, augment=augment, seed=seed)
    x = cut_encoder(encoder, feature)(x)
    if pool is not None:
        x = PoolFeatures(pool, name="pool")(x)
    if isinstance(head, str):
        if head not in HEAD_KINDS:
            raise ValueError(f"head must be one of {HEAD_KINDS} or a Keras layer, got {head!r}")
        if len(x.shape) not in (2, 4):
            raise ValueError(f"feature {feature!r} has shape {tuple(x.shape)}: expected a map "
                             "(B, h, w, C) or a vector (B, D)")
        kind = "fc1" if head == "linear" and len(x.shape) == 2 else head
        head = build_head(kind, tuple(x.shape[1:]), num_classes, batch_norm=batch_norm,
                          name=f"{head}_head")
    logits = head(x)
    return CheckedModel(images, logits, name=name, labels="classes")
