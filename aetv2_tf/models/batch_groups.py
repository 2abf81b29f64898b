"""Batch statistics per group of the batch: per-branch Siamese BatchNorm in ONE encoder call.

Inside `batch_statistics_groups(G)` (read when a layer is called, i.e. traced), a group-aware
BatchNorm in training mode cuts its input ``(G B, ...)`` into ``G`` equal groups along the batch
axis, normalises each by its own statistics and updates the moving averages once per group, in
group order::

    moving <- moving * momentum + (1 - momentum) * statistic_g,   g = 0, 1, ..., G - 1

the same operations as ``G`` calls. Only the one-pass pretext model sets it, around its own
forward pass (`models.aet.OnePassSiamese`, `models.pretext.PairsModel`); elsewhere the layers
are plain BatchNorm. Group-aware: `models.blocks.FusedBatchNormalization` and `BatchNormalization`
here (Keras's layer under the SAME class name, so `.weights.h5` files load unchanged).
`one_pass_blockers` names the layers that keep a model to two encoder calls.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import keras

_GROUPS: contextvars.ContextVar[int] = contextvars.ContextVar("aetv2_batch_statistics_groups",
                                                              default=1)


@contextlib.contextmanager
def batch_statistics_groups(groups: int) -> Iterator[int]:
    """Within this context, group-aware BatchNorm layers in training take their statistics per
    group of ``groups`` equal parts of the batch (1: the whole batch). Yields ``groups``."""
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups must be an int >= 1, got {groups!r}")
    token = _GROUPS.set(groups)
    try:
        yield groups
    finally:
        _GROUPS.reset(token)


def current_batch_statistics_groups() -> int:
    """The number of groups of the innermost `batch_statistics_groups` (1 outside any)."""
    return _GROUPS.get()


def split_batch(inputs, groups: int) -> list:
    """``inputs`` ``(G N, ...)`` -> ``G`` tensors ``(N, ...)`` along axis 0 (a static batch size
    that ``groups`` does not divide: ValueError)."""
    size = inputs.shape[0]
    if size is not None and size % groups:
        raise ValueError(f"a batch of {size} cannot be cut into {groups} equal groups for "
                         "per-group batch statistics")
    return keras.ops.split(inputs, groups, axis=0)


@keras.saving.register_keras_serializable(package="aetv2_tf")
class BatchNormalization(keras.layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` with training statistics per group inside
    `batch_statistics_groups`; elsewhere exactly Keras's layer. Not grouped with a ``mask``,
    ``renorm`` or ``synchronized``."""

    GROUPS_BATCH_STATISTICS = True  # (`groupable`)

    def call(self, inputs, training=None, mask=None):
        groups = current_batch_statistics_groups()
        if groups == 1 or not (training and self.trainable) or mask is not None \
                or not groupable(self):
            return super().call(inputs, training=training, mask=mask)
        parts = [super(BatchNormalization, self).call(part, training=training)
                 for part in split_batch(inputs, groups)]
        return keras.ops.concatenate(parts, axis=0)


def groupable(layer: keras.layers.Layer) -> bool:
    """Whether ``layer`` is a group-aware BatchNorm: its own class declares
    ``GROUPS_BATCH_STATISTICS = True`` (not a subclass), not on the batch axis, without renorm
    or synchronised statistics."""
    if not vars(type(layer)).get("GROUPS_BATCH_STATISTICS", False):
        return False
    return not getattr(layer, "renorm", False) and not getattr(layer, "synchronized", False) \
        and 0 in getattr(layer, "_reduction_axes", [0]) and layer.axis != 0


def _sublayers(model: keras.layers.Layer) -> list[keras.layers.Layer]:
    flatten = getattr(model, "_flatten_layers", None)
    if flatten is not None:
        return list(flatten(include_self=False, recursive=True))
    found = []
    for layer in getattr(model, "layers", []):
        found += [layer, *_sublayers(layer)]
    return found


def one_pass_blockers(encoder: keras.layers.Layer) -> list[str]:
    """The layers of ``encoder`` (recursively) that stop a one-pass per-branch model, as
    "name (ClassName): why": BatchNorm not group-aware, other non-trainable state, random
    numbers. Empty: a grouped joint batch trains as one call per group."""
    blockers = []
    for layer in _sublayers(encoder):
        own = getattr(layer, "_trainable_variables", []) + getattr(
            layer, "_non_trainable_variables", [])
        stateful = any(not v.trainable for v in own)
        why = None
        if groupable(layer):
            continue
        if isinstance(layer, keras.layers.BatchNormalization) or hasattr(layer, "moving_mean"):
            why = "a BatchNorm that is not group-aware"
        elif stateful:
            why = "non-trainable state"
        elif getattr(layer, "seed_generator", None) is not None or \
                getattr(layer, "_seed_generators", None):
            why = "random numbers in training"
        if why:
            blockers.append(f"{layer.name} ({type(layer).__name__}): {why}")
    return blockers


def on_gpu() -> bool:
    """Whether a device of `keras.distribution.list_devices` is a GPU."""
    devices = keras.distribution.list_devices()
    return any(str(d).split(":")[0].lower() in ("gpu", "cuda", "rocm") for d in devices)
