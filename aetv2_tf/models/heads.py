"""Probe classifiers trained on frozen encoder features (docs/method.md section 2).

`build_head(kind, feature_shape, num_classes)` returns a `keras.Model` mapping a feature map
`(B, H, W, C)` (or a vector `(B, D)` for the fc kinds) to float32 logits `(B, num_classes)`:

| kind        | layers                                                                          |
|-------------|---------------------------------------------------------------------------------|
| "fc1"       | Flatten, BN (no affine, per feature), Dense                                     |
| "fc2"       | Flatten, [Dense 200 (no bias), BN, ReLU], Dense                                 |
| "fc3"       | Flatten, 2 x [Dense 200 (no bias), BN, ReLU], Dense                             |
| "conv"      | one NIN block like block 3 (192@3x3, 192@1x1, 192@1x1), GAP, Dense              |
| "linear"    | adaptive pooling to `adaptive_pool_size` (~9,000 features), BN (no affine,      |
|             | per channel, as RotNet's LinearClassifier), Flatten, Dense                      |
| "nonlinear" | [`extra_convs` x conv 256@3x3 + BN + ReLU], MaxPool 3/2, Flatten,               |
|             | Dense 4096 + BN + ReLU, Dense 4096 + BN + ReLU, Dense                           |

"nonlinear" is the RotNet/AETv1 AlexNet head: on conv5 features use `extra_convs=0`; on conv4
features use `extra_convs=1` (it re-learns a conv5 layer). The dense layers of the fc heads use the
RotNet init N(0, sqrt(2 / out_features)); the nonlinear head reuses the AlexNet fc block.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import keras

from aetv2_tf.models.alexnet import alexnet_fc_block
from aetv2_tf.models.blocks import AdaptivePooling2D, conv_bn_relu, dense_bn_relu, make_batch_norm
from aetv2_tf.models.nin import NIN_BLOCK_SPECS, nin_block

HEAD_KINDS = ("fc1", "fc2", "fc3", "conv", "linear", "nonlinear")
FC_HIDDEN_UNITS = 200
LINEAR_TARGET_FEATURES = 9000


def adaptive_pool_size(feature_shape: Sequence[int],
                       target_features: int = LINEAR_TARGET_FEATURES) -> int:
    """Side `s = round(sqrt(target / C))` of the pooled map, capped by the map size (the
    published AlexNet choices: 64 ch -> 12, 192 -> 7, 384 -> 5, 256 -> 6)."""
    height, width, channels = feature_shape[-3:]
    side = round(math.sqrt(target_features / channels))
    return int(max(1, min(side, height, width)))


def _classifier_init(units: int) -> keras.initializers.Initializer:
    """RotNet's probe init for linear layers: N(0, sqrt(2 / out_features))."""
    return keras.initializers.RandomNormal(0.0, math.sqrt(2.0 / units))


def build_head(kind: str, feature_shape: Sequence[int], num_classes: int, batch_norm: str = "fused",
               pool: str = "avg", extra_convs: int = 0, name: str | None = None) -> keras.Model:
    """A probe classifier: features of shape `feature_shape` (no batch axis) -> logits.

    Args:
        kind: one of `HEAD_KINDS` (table in the module docstring).
        feature_shape: e.g. `(8, 8, 192)` for NIN block 2, `(13, 13, 256)` for AlexNet conv5.
        num_classes: number of logits.
        batch_norm: "fused" or "keras" (see `make_batch_norm`).
        pool: "avg" or "max" (the RotNet ImageNet configs') for the "linear" head.
        extra_convs: "nonlinear" only: conv layers before pool5 (1 on conv4 features).
        name: model name (default `f"{kind}_head"`).

    Returns:
        A `keras.Model` `(B, *feature_shape) -> (B, num_classes)` float32; its last layer is
        named "logits".
    """
    if kind not in HEAD_KINDS:
        raise ValueError(f"head kind must be one of {HEAD_KINDS}, got {kind!r}")
    inputs = keras.Input(shape=tuple(feature_shape), name="features")
    x = inputs
    if kind in ("fc1", "fc2", "fc3"):
        x = keras.layers.Flatten(name="flatten")(x)
        if kind == "fc1":
            x = make_batch_norm(batch_norm, name="bn", center=False, scale=False)(x)
        for index in range({"fc1": 0, "fc2": 1, "fc3": 2}[kind]):
            x = dense_bn_relu(x, FC_HIDDEN_UNITS, name=f"fc{index + 1}", batch_norm=batch_norm,
                              kernel_initializer=_classifier_init(FC_HIDDEN_UNITS))
    elif kind == "conv":
        x = nin_block(x, NIN_BLOCK_SPECS[2], name="conv_block", batch_norm=batch_norm)
        x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    elif kind == "linear":
        x = AdaptivePooling2D(adaptive_pool_size(feature_shape), mode=pool, name="pool")(x)
        x = make_batch_norm(batch_norm, name="bn", center=False, scale=False)(x)
        x = keras.layers.Flatten(name="flatten")(x)
    else:  # nonlinear
        for index in range(extra_convs):
            x = conv_bn_relu(x, 256, 3, name=f"head_conv{index + 1}", batch_norm=batch_norm)
        _, x = alexnet_fc_block(x, batch_norm=batch_norm, prefix="head_")
    logits = keras.layers.Dense(num_classes, dtype="float32",
                                kernel_initializer=_classifier_init(num_classes), name="logits")(x)
    return keras.Model(inputs, logits, name=name or f"{kind}_head")
