"""The backbones of the package, one table: every per-backbone fact in one place.

    BACKBONES["nin"].input_size        # 32
    BACKBONES["nin"].probe_feature     # "block2": what the probes and the KNN read by default
    BACKBONES["nin"].build()           # the encoder, `batch_norm_kind` of the backend

A backbone is a functional ``keras.Model`` on ``(S, S, 3)`` float images (normalised) whose
output is a dict of named feature maps (`features`, in order); its name is the table's key.
``pretext_feature``: the feature the AET decoder and RotNet's head read (`build_aet_model`),
``probe_feature``: the feature probed when none is asked for (the paper's: CIFAR-10 NIN block 2,
AlexNet conv5). The normalisation belongs to the data (`data.constants`), the decoder's
parameter scale to the sampler (`data.sampler.parameter_std`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import keras

from aetv2_tf.models.alexnet import build_alexnet
from aetv2_tf.models.nin import build_nin


@dataclasses.dataclass(frozen=True)
class Backbone:
    """One backbone's facts (module docstring) and its builder ``builder(input_shape,
    batch_norm=...)``."""

    name: str
    input_size: int
    features: tuple[str, ...]
    pretext_feature: str
    probe_feature: str
    builder: Callable[..., keras.Model]

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.input_size, self.input_size, 3)

    def build(self, input_shape: tuple[int, int, int] | None = None,
              batch_norm: str | None = None) -> keras.Model:
        """The encoder on ``input_shape`` images (default: `input_shape`), with
        `batch_norm_kind` of ``batch_norm``."""
        return self.builder(tuple(input_shape or self.input_shape),
                            batch_norm=batch_norm_kind(batch_norm))


BACKBONES: dict[str, Backbone] = {
    "nin": Backbone("nin", 32, ("block1", "block2", "block3", "block4"), "block4", "block2",
                    build_nin),
    "alexnet": Backbone("alexnet", 224, ("conv1", "conv2", "conv3", "conv4", "conv5", "fc6",
                                         "fc7"), "fc7", "conv5", build_alexnet),
}


def batch_norm_kind(requested: str | None = None) -> str:
    """THE BatchNorm rule: "fused" (TensorFlow's kernel) or "keras" (any backend) compute the
    same thing with interchangeable weights; under TensorFlow the one ``requested`` (None:
    "fused", the faster), elsewhere "keras" whatever is requested."""
    if requested not in (None, "fused", "keras"):
        raise ValueError(f"batch_norm must be 'fused' or 'keras'; got {requested!r}")
    if keras.backend.backend() != "tensorflow":
        return "keras"
    return requested or "fused"


def backbone(name: str) -> Backbone:
    """The table's entry ``name``; ValueError naming the backbones otherwise."""
    if name not in BACKBONES:
        raise ValueError(f"backbone must be one of {tuple(BACKBONES)}, got {name!r}")
    return BACKBONES[name]
