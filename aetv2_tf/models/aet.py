"""The AET pretext model (Siamese encoder + homography decoder) and the RotNet pretext model.

AET: the same encoder E sees an image x and its warped copy t(x); the decoder regresses the 8
parameters of t (docs/conventions.md) from the concatenated features [E(x), E(t(x))]:

    x    --> E --feature--> GAP --\
                                   concat --> Dense(8) --> T_hat params      (per_branch)
    t(x) --> E --feature--> GAP --/
    (B,H,W,3) each -> (B,h,w,C) -> (B,C) -> (B,2C) -> (B,8) float32

    x, t(x) --concat on batch--> E --feature--> GAP --split & concat--> Dense(8)       (joint)
    (B,H,W,3) x 2  ->  (2B,H,W,3)  ->  (2B,h,w,C)  ->  (2B,C)  ->  (B,2C)  ->  (B,8) float32

* `siamese_batch_norm="per_branch"` (default; docs/reproduction.md): as the AETv1 code, each
  branch is normalised by its own batch statistics and the moving averages are updated twice a
  step, x's first. Computed by two encoder calls (an `After` layer orders them) or, with
  `one_pass`, by ONE call on `concat([x, t(x)])` inside `batch_statistics_groups(2)`
  (`OnePassSiamese`, `models.batch_groups`): faster on an accelerator, needs an encoder whose
  batch-coupled layers are all group-aware (`batch_groups.one_pass_blockers`). `one_pass=None`:
  one pass on a GPU when the encoder allows it, two calls elsewhere.
* `siamese_batch_norm="joint"`: ONE encoder call on `concat([x, t(x)])` with joint statistics.
  All layouts have the same variables: weights and checkpoints load across them.
* Decoder init: bias the identity, kernel small (std `0.1 / sqrt(fan_in)`), so `T_hat` starts
  near the identity (the geodesic loss needs `T^{-1} T_hat` regular) and gradients reach the
  encoder from the first step.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import keras
import numpy as np
from keras import ops

from aetv2_tf.models.backbones import input_side
from aetv2_tf.models.batch_groups import batch_statistics_groups, on_gpu, one_pass_blockers
from aetv2_tf.models.displayed_loss import DataLossModel
from aetv2_tf.models.features import (  # noqa: F401 - default_feature: API
    Feature,
    default_feature,
    encoder_at,
    vector_feature,
)


def identity_params(num_params: int = 8, rotation_deg: float = 0.0) -> np.ndarray:
    """The first `num_params` row-major entries of the 3x3 identity: (1, 0, 0, 0, 1, 0, 0, 0),
    or of the in-plane rotation by `rotation_deg` about the image centre (model frame)."""
    if not 1 <= num_params <= 8:
        raise ValueError(f"num_params must be in 1..8, got {num_params}")
    c, s = math.cos(math.radians(rotation_deg)), math.sin(math.radians(rotation_deg))
    r = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]], "float32")
    return r.reshape(-1)[:num_params]


@keras.saving.register_keras_serializable(package="aetv2_tf")
class PairConcat(keras.layers.Layer):
    """Joint-batch features `(2B, D)` -> per-pair features `(B, 2D)`.

    Row `i` of the output is `concat([f[i], f[B + i]])`, i.e. `[E(x_i), E(t(x_i))]` when the
    joint batch is `concat([x, t(x)], axis=0)`.
    """

    def call(self, inputs):
        first, second = ops.split(inputs, 2, axis=0)
        return ops.concatenate([first, second], axis=-1)

    def compute_output_shape(self, input_shape):
        batch = None if input_shape[0] is None else input_shape[0] // 2
        return (batch, 2 * input_shape[-1])


@keras.saving.register_keras_serializable(package="aetv2_tf")
class After(keras.layers.Layer):
    """`[value, earlier] -> value`, unchanged: the layer fed with `value` runs after the one
    that produced `earlier` (Keras orders a graph's nodes by depth only), so x's BatchNorm
    update comes first on every backend."""

    def call(self, inputs):
        return inputs[0]

    def compute_output_shape(self, input_shape):
        return input_shape[0]


@keras.saving.register_keras_serializable(package="aetv2_tf")
class OnePassSiamese(keras.Model):
    """The per-branch AET model in one encoder call on `concat([x, tx])`, its forward pass
    inside `batch_statistics_groups(batch_groups)` (module docstring)."""

    def __init__(self, *args, batch_groups: int = 2, **kwargs):
        super().__init__(*args, **kwargs)
        self.batch_groups = int(batch_groups)

    def call(self, inputs, training=None, mask=None, **kwargs):
        with batch_statistics_groups(self.batch_groups):
            return super().call(inputs, training=training, mask=mask, **kwargs)

    def get_config(self) -> dict:
        return {**super().get_config(), "batch_groups": self.batch_groups}


def resolve_one_pass(encoder: keras.Model, siamese_batch_norm: str,
                     one_pass: bool | None) -> bool:
    """Whether the AET model calls ``encoder`` once with per-half statistics: only for
    "per_branch"; ``one_pass`` True: when the encoder allows it (else a warning), None: when
    it allows it on a GPU."""
    if one_pass is not None and not isinstance(one_pass, bool):
        raise ValueError(f"one_pass must be None, True or False, got {one_pass!r}")
    if siamese_batch_norm != "per_branch":
        if one_pass:
            raise ValueError(f"one_pass=True is how siamese_batch_norm='per_branch' is "
                             f"computed; {siamese_batch_norm!r} has one call already")
        return False
    if one_pass is False:
        return False
    blockers = one_pass_blockers(encoder)
    if blockers:
        if one_pass:
            warnings.warn(f"one_pass=True: encoder {encoder.name!r} cannot be grouped per branch "
                          f"({'; '.join(blockers[:3])}): two encoder calls instead",
                          stacklevel=3)
        return False
    return bool(one_pass) or on_gpu()


@keras.saving.register_keras_serializable(package="aetv2_tf")
class FromAETv1Targets(keras.layers.Layer):
    """The published AETv1 code's normalised targets ``(B, 8)`` -> model-frame parameters of T
    ``(B, 8)`` float32 (`geometry.params_from_aetv1_official_targets`; no weights)."""

    def __init__(self, image_size: int = 32, **kwargs):
        super().__init__(**kwargs)
        self.image_size = int(image_size)

    def call(self, inputs):
        from aetv2_tf.method.geometry import params_from_aetv1_official_targets

        return params_from_aetv1_official_targets(ops.cast(inputs, "float32"), self.image_size)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self) -> dict:
        return {**super().get_config(), "image_size": self.image_size}


def build_aet_model(encoder: keras.Model, feature: Feature = None, pooled: bool = True,
                    num_params: int = 8, name: str = "aet",
                    param_scale: Sequence[float] | None = None, init_rotation_deg: float = 0.0,
                    pairs: keras.layers.Layer | None = None, siamese_batch_norm: str = "per_branch",
                    target: str = "model", one_pass: bool | None = None, *,
                    _grouping_outside: bool = False) -> keras.Model:
    """The AET pretext model: inputs `[x, tx]`, each `(B, H, W, 3)`; output `(B, num_params)`.

    Args:
        encoder: shared by x and tx (`models.features`).
        feature: the encoder output (name or index) or layer feeding the decoder; None:
            `default_feature(encoder)`.
        pooled: global-average-pool a feature map `(B, h, w, C)`, else flatten it; vectors
            `(B, D)` are used as they are.
        num_params, name: the regressed parameters (8 for a homography), the model's name.
        param_scale: a fixed per-parameter scale: the decoder regresses `params / param_scale`
            and a `Rescaling` layer "decoder_scale" turns them back (AETv1's normalised targets).
        init_rotation_deg: the decoder's initial output is this rotation about the image centre
            (at 0, 180-degree pairs start on the geodesic loss's cut locus).
        siamese_batch_norm, one_pass: "per_branch" or "joint", and how "per_branch" is computed
            (module docstring; True is refused for "joint").
        target: "model" (T's model-frame parameters) or "official" (the AETv1 code's targets,
            `geometry.aetv1_official_targets`, turned into T's parameters by a
            `FromAETv1Targets` layer "from_aetv1_targets"; not with `param_scale`).

    Returns:
        A `keras.Model` `[x, tx]` -> float32 parameters; layers "decoder" and "pair_features"
        `(B, 2D)`; ``batch_groups`` 2 for a one-pass per-branch model, else 1.
    """
    feature, features_of = encoder_at(encoder, feature)
    inputs, (x, tx) = _pair_inputs(encoder, pairs)
    grouped = resolve_one_pass(encoder, siamese_batch_norm, one_pass)
    pair = _pair_features(features_of, x, tx, feature, pooled, siamese_batch_norm, grouped)
    params = _decoder(pair, encoder, num_params, param_scale, init_rotation_deg, target)
    if grouped and not _grouping_outside:
        return OnePassSiamese(inputs, params, name=name, batch_groups=2)
    model = keras.Model(inputs, params, name=name)
    # `_grouping_outside`: a plain model inside a `PairsModel`, which sets the groups itself
    # (the class name keys the weights of a nested model: "functional" as the two calls').
    model.batch_groups = 2 if grouped else 1
    return model


def _pair_inputs(encoder: keras.Model, pairs: keras.Layer | None) -> tuple[list, tuple]:
    """The inputs and the pair ``(x, tx)``: ``[x, tx]`` themselves, or ``[uint8 images,
    T (B, 3, 3)]`` made into the pair by the layer ``pairs``."""
    input_shape = tuple(encoder.inputs[0].shape[1:])
    if pairs is None:
        inputs = [keras.Input(shape=input_shape, name="x"),
                  keras.Input(shape=input_shape, name="tx")]
        return inputs, tuple(inputs)
    inputs = [keras.Input(shape=input_shape, dtype="uint8", name="images"),
              keras.Input(shape=(3, 3), name="t")]
    return inputs, tuple(pairs(inputs))


def _pair_features(features_of, x, tx, feature, pooled: bool, siamese_batch_norm: str,
                   grouped: bool):
    """The pair features ``(B, 2D)`` = ``[E(x), E(tx)]`` ("pair_features"): one encoder call
    on the joint batch ("joint", or ``grouped``) or two calls, x's first."""
    if siamese_batch_norm == "joint" or grouped:
        joint = keras.layers.Concatenate(axis=0, name="joint_batch")([x, tx])
        features = vector_feature(features_of(joint), feature, pooled)
        return PairConcat(name="pair_features")(features)
    if siamese_batch_norm == "per_branch":  # x's call first: its BN update comes first
        first = vector_feature(features_of(x), feature, pooled, "_x")
        second = vector_feature(features_of(After(name="after_x")([tx, first])), feature,
                                pooled, "_tx")
        return keras.layers.Concatenate(axis=-1, name="pair_features")([first, second])
    raise ValueError(f"siamese_batch_norm must be 'joint' or 'per_branch', got "
                     f"{siamese_batch_norm!r}")


def _decoder(pair, encoder: keras.Model, num_params: int, param_scale, init_rotation_deg: float,
             target: str):
    """The decoder: pair features ``(B, 2D)`` -> ``(B, num_params)`` float32 parameters of T
    (`build_aet_model`'s arguments)."""
    scale = np.ones(num_params) if param_scale is None else np.asarray(param_scale, np.float64)
    initial = identity_params(num_params, init_rotation_deg) / scale
    if target == "official":
        from aetv2_tf.method.geometry import aetv1_official_targets

        if param_scale is not None or num_params != 8:
            raise ValueError("target='official' regresses the AETv1 code's 8 normalised "
                             "targets: no param_scale")
        side = input_side(encoder)
        initial = keras.ops.convert_to_numpy(aetv1_official_targets(
            identity_params(8, init_rotation_deg)[None].astype(np.float64), side))[0]
    elif target != "model":
        raise ValueError(f"target must be 'model' or 'official', got {target!r}")
    params = keras.layers.Dense(
        num_params,
        dtype="float32",
        kernel_initializer=keras.initializers.VarianceScaling(0.01, "fan_in", "truncated_normal"),
        bias_initializer=keras.initializers.Constant(initial),
        name="decoder",
    )(pair)
    if target == "official":
        params = FromAETv1Targets(side, dtype="float32", name="from_aetv1_targets")(params)
    if param_scale is not None:
        params = keras.layers.Rescaling([float(v) for v in scale], dtype="float32",
                                        name="decoder_scale")(params)
    return params


def build_rotation_classifier(encoder: keras.Model, feature: Feature = None, num_classes: int = 4,
                              name: str = "rotnet") -> keras.Model:
    """RotNet's classifier of the quarter turns: image `(B, H, W, 3)` -> logits `(B, 4)`
    float32, a `displayed_loss.DataLossModel`; `feature` as `build_aet_model`, a map
    global-average-pooled."""
    feature, features_of = encoder_at(encoder, feature)
    inputs = keras.Input(shape=tuple(encoder.inputs[0].shape[1:]), name="image")
    features = vector_feature(features_of(inputs), feature, pooled=True)
    logits = keras.layers.Dense(num_classes, dtype="float32", name="rotation_logits")(features)
    return DataLossModel(inputs, logits, name=name)

