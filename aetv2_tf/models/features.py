"""The feature of an encoder, whatever its outputs: ONE rule for every `feature=` argument.

An encoder is a functional or Sequential `keras.Model` built on a `keras.Input`. A feature is a
key of a dict output (`build_backbone`), the producing layer's name or the index of a list
output, the last layer's name of a single output, or the name of ANY layer (`cut_encoder` then
ends the encoder there). `feature=None`: for the pretext models `default_feature`
(`Backbone.pretext_feature`, else the only output); where a feature is probed
`classifier_feature` (`Backbone.probe_feature`, else `default_feature`). A feature is a map
``(B, h, w, C)`` or a vector ``(B, D)`` (`vector_feature` refuses other ranks).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from aetv2_tf.errors import UsageError
from aetv2_tf.models.backbones import BACKBONES

Feature = str | int | None


def output_structure(encoder: keras.Model) -> Any:
    """The symbolic outputs of `encoder`, in its structure: a dict, a list, or one KerasTensor."""
    try:
        if isinstance(encoder, keras.Sequential):
            return encoder.outputs[0]
        return encoder.output
    except (AttributeError, ValueError, TypeError, IndexError) as e:
        raise ValueError(f"encoder {encoder.name!r} has no symbolic outputs: pass a functional "
                         "or Sequential keras.Model built on keras.Input(shape=...) (for a "
                         "Sequential, begin it with keras.Input)") from e


def _producer(tensor) -> str:
    return tensor._keras_history.operation.name


def output_names(encoder: keras.Model) -> list[str]:
    """The names `feature=` gives to the outputs of `encoder` (module docstring), in order."""
    outputs = output_structure(encoder)
    if isinstance(outputs, dict):
        return [str(key) for key in outputs]
    tensors = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    names = [_producer(t) for t in tensors]
    if len(set(names)) < len(names):  # one layer with several outputs: name them by position
        names = [f"output_{i}" for i in range(len(names))]
    return names


def _layer_names(encoder: keras.Model) -> list[str]:
    return [layer.name for layer in getattr(encoder, "layers", [])]


def default_feature(encoder: keras.Model) -> str:
    """The ONE rule for `feature=None`: a package backbone's pretext feature, else the only
    output of a single-output encoder; otherwise ValueError listing the outputs."""
    outputs = output_structure(encoder)
    names = output_names(encoder)
    if encoder.name in BACKBONES and BACKBONES[encoder.name].pretext_feature in names:
        return BACKBONES[encoder.name].pretext_feature
    if not isinstance(outputs, dict) and len(names) == 1:
        return names[0]
    raise ValueError(f"no default feature for an encoder named {encoder.name!r} (known: "
                     f"{sorted(BACKBONES)}); pass feature= explicitly, one of its "
                     f"outputs {names}")


def resolve_feature(encoder: keras.Model, feature: Feature) -> str:
    """The name of `feature` of `encoder`: None -> `default_feature`; an int -> the output at
    that index; an output's or a layer's name -> itself; else an error listing the outputs."""
    if feature is None:
        return default_feature(encoder)
    names = output_names(encoder)
    if isinstance(feature, int) and not isinstance(feature, bool):
        if not 0 <= feature < len(names):
            raise ValueError(f"feature={feature}: encoder {encoder.name!r} has {len(names)} "
                             f"outputs {names}")
        return names[feature]
    if feature in names or feature in _layer_names(encoder):
        return str(feature)
    raise UsageError(f"unknown feature {feature!r}: encoder {encoder.name!r} outputs {names} "
                     f"(or name one of its {len(_layer_names(encoder))} layers, encoder.layers, "
                     "to cut it there)")


def classifier_feature(encoder: keras.Model, feature: Feature = None) -> str:
    """The ONE rule for a probed feature: `feature` if given, else a package backbone's probe
    feature, else `default_feature`."""
    if feature is None and encoder.name in BACKBONES:
        try:
            return resolve_feature(encoder, BACKBONES[encoder.name].probe_feature)
        except ValueError:  # a custom encoder named "nin": its own default
            return default_feature(encoder)
    return resolve_feature(encoder, feature)


def is_output(encoder: keras.Model, feature: str) -> bool:
    """Whether `feature` (resolved) names an output of `encoder` (else it names a layer)."""
    return feature in output_names(encoder)


def select_output(encoder: keras.Model, outputs, feature: str):
    """Pick the output named `feature` from `outputs`, a result of calling `encoder` (a dict, a
    list/tuple, or one tensor)."""
    if isinstance(outputs, dict):
        return outputs[feature]
    index = output_names(encoder).index(feature)
    return outputs[index] if isinstance(outputs, (list, tuple)) else outputs


def feature_tensor(encoder: keras.Model, feature: str):
    """The symbolic tensor of `feature` (resolved) in the graph of `encoder`."""
    if is_output(encoder, feature):
        return select_output(encoder, output_structure(encoder), feature)
    try:
        return encoder.get_layer(feature).output
    except (AttributeError, ValueError) as e:
        raise ValueError(f"layer {feature!r} of encoder {encoder.name!r} has no single output "
                         f"to cut at ({e}); name one of its outputs {output_names(encoder)}") \
            from e


def cut_encoder(encoder: keras.Model, feature: Feature = None,
                name: str | None = None) -> keras.Model:
    """The encoder from its input to `feature` only: `(B, H, W, 3) -> (B, h, w, C)` or
    `(B, D)`, its layers SHARED with `encoder` (an encoder whose only output is `feature`:
    itself). `name`: default the encoder's."""
    feature = resolve_feature(encoder, feature)
    outputs = output_structure(encoder)
    if not isinstance(outputs, (dict, list, tuple)) and is_output(encoder, feature):
        return encoder
    return keras.Model(encoder.inputs, feature_tensor(encoder, feature),
                       name=name or encoder.name)


def encoder_at(encoder: keras.Model, feature: Feature):
    """`(feature name, fn)`: `fn(x)` is the feature tensor of `encoder` on `x` (an output picked
    from the encoder's call, a layer's through `cut_encoder`)."""
    feature = resolve_feature(encoder, feature)
    if is_output(encoder, feature):
        return feature, lambda x: select_output(encoder, encoder(x), feature)
    cut = cut_encoder(encoder, feature, name=f"{encoder.name}_to_{feature}")
    return feature, cut


def vector_feature(x, feature: str, pooled: bool = True, suffix: str = ""):
    """A feature `x` as a vector: a map `(B, h, w, C)` -> `(B, C)` (global average pooling,
    layer "<feature>_gap<suffix>") or `(B, h*w*C)` (`pooled=False`, "<feature>_flatten
    <suffix>"); a vector `(B, D)` as it is; other ranks: ValueError."""
    if len(x.shape) == 4:
        layer = keras.layers.GlobalAveragePooling2D if pooled else keras.layers.Flatten
        name = f"{feature}_{'gap' if pooled else 'flatten'}{suffix}"
        return layer(name=name.replace("/", "_"))(x)
    if len(x.shape) != 2:
        raise ValueError(f"feature {feature!r} has shape {tuple(x.shape)}: expected a map "
                         "(B, h, w, C) or a vector (B, D)")
    return x


#: How `pool_feature_map` turns a feature map into a vector (the KNN's and the classifiers').
POOLS = ("avg2x2", "global", "flatten")


def pool_feature_map(maps, pool: str = "avg2x2"):
    """``(B, h, w, C)`` feature maps -> ``(B, D)`` float32 features (Keras ops, any backend).

    ``"avg2x2"``: 2x2 average pooling, stride 2, flattened channel-major (PyTorch's order; NIN
    block 2 -> 3,072); ``"global"``: the mean over ``h, w``; ``"flatten"``. Rank 2 passes.
    """
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
    ops = keras.ops
    if not isinstance(maps, keras.KerasTensor):
        maps = ops.convert_to_tensor(maps)
    if len(maps.shape) == 2:
        return ops.cast(maps, "float32")
    if len(maps.shape) != 4:
        raise ValueError(f"expected (B, h, w, C) feature maps or (B, D) features, got "
                         f"shape {tuple(maps.shape)}")
    maps = ops.cast(maps, "float32")
    if pool == "global":
        return ops.mean(maps, axis=(1, 2))
    if pool == "avg2x2":
        maps = ops.transpose(ops.average_pool(maps, 2, strides=2, padding="valid"), (0, 3, 1, 2))
    if any(d is None for d in maps.shape[1:]):
        return ops.reshape(maps, (ops.shape(maps)[0], -1))
    return ops.reshape(maps, (-1, int(np.prod(maps.shape[1:]))))
