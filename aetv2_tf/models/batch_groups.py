"""Batch statistics per group of the batch: per-branch Siamese BatchNorm in ONE encoder call.

The per-branch AET model (`models.aet.build_aet_model`, ``siamese_batch_norm="per_branch"``)
normalises x's batch and t(x)'s batch each by its own statistics, and updates every BatchNorm
layer's moving averages twice a step, x's batch first. Two encoder calls do that; so does ONE
call on the joint batch ``concat([x, t(x)])`` ``(G B, ...)`` whose BatchNorm layers, in training
mode, cut their input into ``G`` equal groups along the batch axis (group ``g`` = rows
``g B .. (g + 1) B - 1``), normalise each group by its own batch statistics and update the
moving averages once per group, in group order::

    moving <- moving * momentum + (1 - momentum) * statistic_g,   g = 0, 1, ..., G - 1

which are the same operations, in the same order, as ``G`` calls (every convolution then runs
once on ``G B`` images: fewer, larger kernels on an accelerator).

How it is switched on: `batch_statistics_groups` (a context, read when a layer is CALLED, i.e.
while a step is traced) tells the group-aware layers how many groups the batch has. Only the
pretext model that holds the one joint-batch call sets it, around its own forward pass
(`models.aet.OnePassSiamese`, `models.pretext.PairsModel`): the same encoder called by any other
model (a classifier built on it after pretraining) sees no groups. Outside the context, and in
inference mode, the layers are plain BatchNorm.

Group-aware layers: `models.blocks.FusedBatchNormalization` (TensorFlow's fused kernel, one
kernel call per group) and `BatchNormalization` here, a subclass of
``keras.layers.BatchNormalization`` with the SAME class name (`.weights.h5` files key a layer by
its class name: the files, checkpoints and presets written with Keras's class load unchanged; it
is registered under the package "aetv2_tf", so a `.keras` file that holds it reloads once
``aetv2_tf`` is imported). It calls Keras's own ``call`` once per group, so its float32 moments
of half-precision inputs are Keras's. `one_pass_blockers` names the layers of an encoder that
stop a one-pass model (a BatchNorm of another class, a layer with other state or randomness):
with any of them the pretext model keeps two encoder calls.
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
    """Within this context, group-aware BatchNorm layers called in training mode take their
    statistics per group of ``groups`` equal parts of the batch (module docstring); 1: the
    whole batch (the default). Yields ``groups``; the previous value is restored on exit."""
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
    """``keras.layers.BatchNormalization`` that takes its training statistics per group of the
    batch inside `batch_statistics_groups` (module docstring); elsewhere exactly Keras's layer
    (the same arguments, variables, class name and weight paths). Grouping applies to the plain
    case only: not with a ``mask``, ``renorm`` or ``synchronized`` (`one_pass_blockers` keeps
    such layers out of a one-pass model)."""

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
    """Whether ``layer`` is a group-aware BatchNorm: of a class that declares it
    (``GROUPS_BATCH_STATISTICS = True`` in its own body: `BatchNormalization` here and
    `models.blocks.FusedBatchNormalization`; not a subclass, which may compute otherwise), on
    any axis but the batch's, without renorm or synchronised statistics."""
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
    "name (ClassName): why": BatchNorm layers that are not group-aware (`groupable`), layers
    with other non-trainable state (batch statistics we cannot group) and layers that draw
    random numbers (one call would draw other numbers than two). Empty: every layer's
    training behaviour on a grouped joint batch equals that of one call per group."""
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
    """Whether the Keras backend computes on a GPU: a device of `keras.distribution.list_devices`
    (JAX's, TensorFlow's or PyTorch's, in that backend's words) is a GPU."""
    devices = keras.distribution.list_devices()
    return any(str(d).split(":")[0].lower() in ("gpu", "cuda", "rocm") for d in devices)
