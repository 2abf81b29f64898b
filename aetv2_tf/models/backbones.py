"""The backbones of the package, one table: every per-backbone fact in one place.

    BACKBONES["nin"].input_size        # 32: the side it is built for by default
    BACKBONES["nin"].probe_feature     # "block2": what the probes and the KNN read by default
    build_backbone("nin")              # THE way to build an encoder of the table
    input_side(encoder)                # 32: the side of an encoder's square input, once built

A backbone is a functional ``keras.Model`` on ``(S, S, 3)`` normalised float images whose
output is a dict of named feature maps (`features`); its name is the table's key.
``pretext_feature``: what the AET decoder and RotNet's head read; ``probe_feature``: what is
probed by default (the paper's). ``input_size`` is only the default shape to build on: a built
encoder's side is read from it (`input_side`).
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
    batch_norm=...)`` (called by `build_backbone`)."""

    name: str
    input_size: int
    features: tuple[str, ...]
    pretext_feature: str
    probe_feature: str
    builder: Callable[..., keras.Model]

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.input_size, self.input_size, 3)


BACKBONES: dict[str, Backbone] = {
    "nin": Backbone("nin", 32, ("block1", "block2", "block3", "block4"), "block4", "block2",
                    build_nin),
    "alexnet": Backbone("alexnet", 224, ("conv1", "conv2", "conv3", "conv4", "conv5", "fc6",
                                         "fc7"), "fc7", "conv5", build_alexnet),
}


def batch_norm_kind(requested: str | None = None) -> str:
    """THE BatchNorm rule: under TensorFlow the one ``requested`` (None: "fused"), elsewhere
    "keras" whatever is requested (the same computation and weights)."""
    if requested not in (None, "fused", "keras"):
        raise ValueError(f"batch_norm must be 'fused' or 'keras'; got {requested!r}")
    if keras.backend.backend() != "tensorflow":
        return "keras"
    return requested or "fused"


def build_backbone(name: str = "nin", input_shape: tuple[int, int, int] | None = None,
                   batch_norm: str | None = None) -> keras.Model:
    """The backbone ``name`` of the table on ``input_shape`` images (default: its row's), its
    BatchNorm by `batch_norm_kind`. ValueError naming the backbones otherwise."""
    if name not in BACKBONES:
        raise ValueError(f"backbone must be one of {tuple(BACKBONES)}, got {name!r}")
    row = BACKBONES[name]
    return row.builder(tuple(input_shape or row.input_shape),
                       batch_norm=batch_norm_kind(batch_norm))


def input_side(model: keras.Model, *, any_size: bool = False) -> int | None:
    """The side S of the square images ``(B, S, S, C)`` ``model.inputs[0]`` takes; with
    ``any_size``, None for a model of any size. ValueError naming the fix otherwise."""
    try:
        shape = tuple(model.inputs[0].shape)
    except (AttributeError, IndexError, TypeError, ValueError) as e:
        raise ValueError(f"{getattr(model, 'name', model)!r} has no symbolic input: pass a "
                         "functional or Sequential keras.Model built on keras.Input") from e
    if len(shape) == 4 and shape[1] is None and shape[2] is None and any_size:
        return None
    if len(shape) != 4 or shape[1] is None or shape[1] != shape[2]:
        raise ValueError(f"{model.name!r} takes inputs of shape {shape}: expected square images "
                         "of a known size (B, S, S, C), e.g. build_backbone('nin', "
                         "input_shape=(64, 64, 3))")
    return int(shape[1])
