"""The AET pretext model (Siamese encoder + homography decoder) and the RotNet pretext model.

AET: the same encoder E sees an image x and its warped copy t(x); the decoder regresses the 8
parameters of t (docs/conventions.md) from the concatenated features [E(x), E(t(x))]:

    x    --> E --feature--> GAP --\
                                   concat --> Dense(8) --> T_hat params      (per_branch)
    t(x) --> E --feature--> GAP --/
    (B,H,W,3) each -> (B,h,w,C) -> (B,C) -> (B,2C) -> (B,8) float32

    x, t(x) --concat on batch--> E --feature--> GAP --split & concat--> Dense(8)       (joint)
    (B,H,W,3) x 2  ->  (2B,H,W,3)  ->  (2B,h,w,C)  ->  (2B,C)  ->  (B,2C)  ->  (B,8) float32

Choices:
* Weight sharing, `siamese_batch_norm="per_branch"` (the default: better features at both
  seeds measured, no slower on a CPU; docs/reproduction.md): the published
  AETv1 code's way (`Regressor.forward` in maple-research-lab/AET: two forward passes of the
  shared network, x first, then t(x)): the encoder is called on x and on t(x) separately, each
  branch normalised by its own batch statistics, and the moving averages updated twice a step,
  x's batch first, then t(x)'s.
  Implemented in one of two ways, the same mathematics (`one_pass` of `build_aet_model`):
  two encoder calls (x, then t(x); an `After` layer orders them), or ONE encoder call on the
  joint batch `concat([x, t(x)])` whose BatchNorm layers take their statistics per half and
  update their moving averages twice, x's half first (`models.batch_groups`): every convolution
  runs once on 2B images, which an accelerator runs faster. The one-pass model is an
  `OnePassSiamese` (or a `models.pretext.PairsModel`) that sets `batch_statistics_groups(2)`
  around its own forward pass only: the encoder called by another model (a classifier built on
  it) computes as usual. It needs an encoder whose BatchNorm layers are all group-aware (the
  package's backbones: `FusedBatchNormalization`, or `batch_groups.BatchNormalization`, which is
  Keras's layer under the same class name) and no other batch-coupled or random layer
  (`batch_groups.one_pass_blockers`); else two calls. `one_pass=None` (the default): one pass
  when the encoder allows it and the backend computes on a GPU; two calls on a CPU, where the
  numerics of CI and the tests stay those of two calls. Both layouts have the same variables:
  weights and checkpoints load across them (and across "joint").
* `siamese_batch_norm="joint"`: ONE encoder call on the joint
  batch `concat([x, t(x)], axis=0)`; batch norm normalizes with the joint statistics of the
  original and the transformed images (in training mode) and updates its moving averages once a
  step. The same variables either way: checkpoints of one load into the other.
* Decoder init: the bias is the identity `(1, 0, 0, 0, 1, 0, 0, 0)` and the kernel is small
  (truncated normal, std `0.1 / sqrt(fan_in)`), so at step 0 `T_hat` is close to the identity, a
  regular matrix: the geodesic loss needs `T^{-1} T_hat` well away from singular. A non-zero
  kernel lets the gradient reach the encoder from the first step.
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
    """`[value, earlier] -> value`, unchanged: a node that makes the layer fed with `value` run
    after the one that produced `earlier`. Keras runs a functional graph's nodes by depth, and
    two calls of one encoder on two inputs have the same depth (measured: t(x)'s ran first);
    with `After` the t(x) branch depends on the x branch, so the x branch's BatchNorm update
    comes first on every backend (the AETv1 code's order)."""

    def call(self, inputs):
        return inputs[0]

    def compute_output_shape(self, input_shape):
        return input_shape[0]


@keras.saving.register_keras_serializable(package="aetv2_tf")
class OnePassSiamese(keras.Model):
    """The per-branch AET model in one encoder call (module docstring): a functional model on
    `[x, tx]` whose graph calls the encoder once on `concat([x, tx])` and whose forward pass
    runs inside `batch_statistics_groups(batch_groups)`, so that each half of the joint batch
    has its own BatchNorm statistics. ``batch_groups``: 2 (x and t(x))."""

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
    """Whether a ``siamese_batch_norm`` AET model of ``encoder`` calls it once on the joint
    batch with per-half statistics: only for "per_branch"; ``one_pass`` False: no; True: yes
    when the encoder allows it (`batch_groups.one_pass_blockers`), else two calls with a
    warning that names why; None: yes when it allows it and the backend computes on a GPU."""
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
    ``(B, 8)`` float32 (`geometry.params_from_aetv1_official_targets`, fixed, no weights): the
    decoder of ``build_aet_model(..., target="official")`` regresses those targets, and every
    consumer downstream still reads T's parameters."""

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


def build_aet_model(
    encoder: keras.Model,
    feature: Feature = None,
    pooled: bool = True,
    num_params: int = 8,
    name: str = "aet",
    param_scale: Sequence[float] | None = None,
    init_rotation_deg: float = 0.0,
    pairs: keras.layers.Layer | None = None,
    siamese_batch_norm: str = "per_branch",
    target: str = "model",
    one_pass: bool | None = None,
    *,
    _grouping_outside: bool = False,
) -> keras.Model:
    """The AET pretext model: inputs `[x, tx]`, each `(B, H, W, 3)`; output `(B, num_params)`.

    Args:
        encoder: shared by x and tx: a backbone from `build_backbone` (dict outputs) or any
            functional / Sequential Keras model on `keras.Input` (`models.features`).
        feature: which encoder output feeds the decoder: a name or index of an output, or the
            name of a layer (the encoder is then cut there, `cut_encoder`); None:
            `default_feature(encoder)` ("block4" for NIN, "fc7" for AlexNet, the only output of
            a single-output encoder).
        pooled: global-average-pool a feature map `(B, h, w, C)` (NIN: 192 + 192 inputs to the
            decoder); if False the map is flattened. Vector features `(B, D)` (fc7: 4096 + 4096)
            are used as they are.
        num_params: number of regressed parameters (8 for a homography).
        name: model name.
        param_scale: optional fixed per-parameter scale (e.g. the parameters' std under the
            sampler): the decoder then regresses `params / param_scale`, O(1) numbers, and a
            fixed `Rescaling` layer ("decoder_scale") turns them back into parameters. With the
            std-normalised MSE this is exactly the AETv1 code's regression of normalised targets;
            without it, small-std parameters get gradients ~1/std^2 larger (SGD at lr 0.1 then
            diverges within 10 steps, measured).
        init_rotation_deg: the decoder's initial output (its bias) is the rotation by this angle
            about the image centre instead of the identity. At 0 every 180-degree pair starts on
            the cut locus of the geodesic loss (theta = pi, no gradient); at 45 no quarter turn
            does (docs/reproduction.md).
        siamese_batch_norm: "per_branch" (default: two calls, each branch with its own batch
            statistics, as the AETv1 code) or "joint" (one encoder call on `concat([x, tx])`):
            module docstring.
        target: "model" (the decoder regresses T's model-frame parameters) or "official" (it
            regresses the published AETv1 code's normalised targets, PIL's inverse map in
            corner-origin pixels, `geometry.aetv1_official_targets`; starting at the identity's;
            a fixed `FromAETv1Targets` layer, "from_aetv1_targets", turns them into T's
            parameters). Not with `param_scale`.
        one_pass: how "per_branch" is computed (module docstring): True: one encoder call on
            the joint batch with per-half BatchNorm statistics (an `OnePassSiamese`) where the
            encoder allows it, else two calls with a warning; False: two calls; None (default):
            one call on a GPU when the encoder allows it, two elsewhere. Not True for
            "joint".

    Returns:
        A `keras.Model` mapping `[x, tx]` to float32 parameters; the decoder layer is "decoder"
        and the pair features `(B, 2D)` are the output of the layer "pair_features". Its
        attribute ``batch_groups`` is 2 for a one-pass per-branch model, else 1.
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
    """The AET model's inputs and its pair ``(x, tx)``: the inputs ``[x, tx]`` themselves, or
    ``[uint8 images, T (B, 3, 3)]`` made into the pair by the layer ``pairs``."""
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
    """The pair features ``(B, 2D)`` = ``[E(x), E(tx)]`` of the layer "pair_features": one
    encoder call on the joint batch ("joint", or "per_branch" computed in one pass with
    per-half statistics: ``grouped``) or two calls, x's first (module docstring)."""
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
    """The decoder on the pair features ``(B, 2D)`` -> ``(B, num_params)`` float32 parameters
    of T (`build_aet_model`'s ``param_scale``, ``init_rotation_deg`` and ``target``; the
    official targets are those of the encoder's images, `input_side`)."""
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


def build_rotation_classifier(
    encoder: keras.Model,
    feature: Feature = None,
    num_classes: int = 4,
    name: str = "rotnet",
) -> keras.Model:
    """RotNet's classifier of the quarter turns: image `(B, H, W, 3)` -> rotation logits
    `(B, 4)` float32, a `displayed_loss.DataLossModel` (its weight decay shown apart from its
    cross-entropy); `models.pretext.build_rotations_model` makes the turns of uint8 images and
    calls it: the RotNet pretext model.

    `feature`: as `build_aet_model` (None: `default_feature(encoder)`); a feature map is
    global-average-pooled (vector features are used as they are).
    """
    feature, features_of = encoder_at(encoder, feature)
    inputs = keras.Input(shape=tuple(encoder.inputs[0].shape[1:]), name="image")
    features = vector_feature(features_of(inputs), feature, pooled=True)
    logits = keras.layers.Dense(num_classes, dtype="float32", name="rotation_logits")(features)
    return DataLossModel(inputs, logits, name=name)

