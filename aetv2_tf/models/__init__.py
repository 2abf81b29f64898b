"""Backbones (NIN, AlexNet), the AET/RotNet pretext models, probe heads and shared layers."""

from aetv2_tf.models.aet import (
    PairConcat,
    build_aet_model,
    build_rotation_classifier,
    default_feature,
    identity_params,
)
from aetv2_tf.models.alexnet import build_alexnet
from aetv2_tf.models.backbones import (
    BACKBONES,
    Backbone,
    batch_norm_kind,
    build_backbone,
    input_side,
)
from aetv2_tf.models.blocks import (
    BATCH_NORM_KINDS,
    AdaptivePooling2D,
    FusedBatchNormalization,
    conv_bn_relu,
    dense_bn_relu,
    make_batch_norm,
)
from aetv2_tf.models.heads import HEAD_KINDS, adaptive_pool_size, build_head
from aetv2_tf.models.nin import build_nin
from aetv2_tf.models.pretext import PairsModel, WarpPairs, build_pairs_model, build_rotations_model

__all__ = [
    "BACKBONES", "BATCH_NORM_KINDS", "Backbone", "HEAD_KINDS", "AdaptivePooling2D",
    "FusedBatchNormalization", "PairConcat", "PairsModel", "WarpPairs", "adaptive_pool_size",
    "build_aet_model", "build_alexnet", "build_backbone", "build_head", "build_nin",
    "build_pairs_model", "build_rotations_model", "build_rotation_classifier", "batch_norm_kind",
    "default_feature", "conv_bn_relu", "dense_bn_relu", "identity_params", "input_side",
    "make_batch_norm",
]
