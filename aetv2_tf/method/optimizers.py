"""Optimisers, learning-rate schedules and weight decay for every stage.

Schedules are functions of the optimiser's step counter only, so a resumed run continues exactly
where the interrupted one was (the AETv1 code restarts its schedule on resume; this does not).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import keras
import numpy as np
from keras import ops

# The AETv1 CIFAR table (1500 epochs): multiplier x1 until epoch 240, x0.2 to 480, x0.04 to 640,
# x0.008 to 800, x0.0016 to 1000, then linear decay to ~1e-5 (x1e-4). Stored as fractions of the
# run so that the same shape applies to any run length.
AETV1_BOUNDARIES = (240 / 1500, 480 / 1500, 640 / 1500, 800 / 1500)
AETV1_MULTIPLIERS = (1.0, 0.2, 0.04, 0.008, 0.0016)
AETV1_DECAY_START, AETV1_FINAL_MULTIPLIER = 1000 / 1500, 1e-4
#: `step`'s default drops, as fractions of the run (the probe heads' 30%, 60%, 80%).
STEP_DROPS = (0.3, 0.6, 0.8)


@keras.saving.register_keras_serializable(package="aetv2_tf")
class Schedule(keras.optimizers.schedules.LearningRateSchedule):
    """Learning rate at a step: `constant`, `aetv1`, `cosine` or `step`, with linear warm-up.

    `step` multiplies by `drop_factor` (0.2) at each fraction `drops` of `total_steps` (30%, 60%
    and 80%: the probe-head schedules) or, given `drop_epochs` of a run of `epochs` epochs, from
    the first step after each of those epochs: step ``ceil(e * total_steps / epochs)``
    (`drop_steps`, converted once here; ``e * steps_per_epoch`` when the epochs size the run).
    """

    def __init__(self, kind: str, peak: float, total_steps: int, warmup_steps: int = 0,
                 drops: Sequence[float] = STEP_DROPS, drop_factor: float = 0.2,
                 drop_epochs: Sequence[int] = (), epochs: int = 0):
        if kind not in ("constant", "aetv1", "cosine", "step"):
            raise ValueError(f"unknown lr schedule {kind!r}: constant, aetv1, cosine or step")
        if drop_epochs and int(epochs) < 1:
            raise ValueError(f"drop_epochs={tuple(drop_epochs)} are epochs of a run of `epochs` "
                             f"epochs: pass epochs >= 1, not {epochs}")
        self.kind, self.peak = kind, float(peak)
        self.total_steps, self.warmup_steps = max(int(total_steps), 1), int(warmup_steps)
        self.drops, self.drop_factor = tuple(float(d) for d in drops), float(drop_factor)
        self.drop_epochs, self.epochs = tuple(int(e) for e in drop_epochs), int(epochs)
        self.drop_steps = tuple(-(-e * self.total_steps // self.epochs) for e in self.drop_epochs)

    def _multiplier(self, step, frac):
        if self.kind == "constant":
            return ops.ones_like(frac)
        if self.kind == "cosine":
            return 0.5 * (1.0 + ops.cos(math.pi * ops.minimum(frac, 1.0)))
        at = frac
        if self.kind == "step":
            at, bounds = (step, self.drop_steps) if self.drop_steps else (frac, self.drops)
            mults = tuple(self.drop_factor ** i for i in range(len(bounds) + 1))
        else:
            bounds, mults = AETV1_BOUNDARIES, AETV1_MULTIPLIERS
        m = ops.full_like(frac, mults[0])
        for b, v in zip(bounds, mults[1:], strict=True):
            m = ops.where(at >= b, v, m)
        if self.kind == "aetv1":  # linear decay over the last third of the run
            start, end = AETV1_DECAY_START, AETV1_MULTIPLIERS[-1]
            t = ops.clip((frac - start) / (1.0 - start), 0.0, 1.0)
            m = ops.where(frac >= start, end + t * (AETV1_FINAL_MULTIPLIER - end), m)
        return m

    def __call__(self, step):
        step = ops.cast(step, "float32")
        frac = step / float(self.total_steps)
        lr = self.peak * self._multiplier(step, frac)
        if self.warmup_steps > 0:
            lr = lr * ops.minimum(1.0, (step + 1.0) / float(self.warmup_steps))
        return lr

    def reached_peak(self) -> float:
        """The largest learning rate of steps ``0 .. total_steps - 1``: `peak` unless the
        warm-up is cut short by the run or overlaps the decay (the multiplier only falls, so
        the maximum is within the warm-up's first ``min(warmup_steps, total_steps)`` steps)."""
        if self.warmup_steps <= 0:
            return self.peak
        steps = np.arange(min(self.warmup_steps, self.total_steps), dtype=np.float32)
        return float(np.max(ops.convert_to_numpy(self(steps))))

    def get_config(self) -> dict:
        return dict(kind=self.kind, peak=self.peak, total_steps=self.total_steps,
                    warmup_steps=self.warmup_steps, drops=list(self.drops),
                    drop_factor=self.drop_factor, drop_epochs=list(self.drop_epochs),
                    epochs=self.epochs)


@keras.saving.register_keras_serializable(package="aetv2_tf")
class SkipNonFinite(keras.optimizers.LossScaleOptimizer):
    """Applies a step only when every gradient is finite; otherwise skips it and counts it.

    Built on Keras' `LossScaleOptimizer` (whose distributed finite-check is reused) with the loss
    scale fixed at 1: nothing is rescaled, a non-finite step changes no weight, no optimiser slot
    and not the step counter, and `skipped_steps` grows by one. Under `mixed_float16` use the real
    dynamic `LossScaleOptimizer` instead, which skips non-finite steps the same way.
    """

    def __init__(self, inner_optimizer, **kwargs):
        kwargs.pop("initial_scale", None)
        kwargs.pop("dynamic_growth_steps", None)
        super().__init__(inner_optimizer, initial_scale=1.0, dynamic_growth_steps=2**31 - 1,
                         **kwargs)

    def build(self, var_list):
        self.skipped_steps = self.add_variable(
            shape=(), dtype="int", initializer="zeros", aggregation="none",
            name="skipped_steps")
        super().build(var_list)

    def scale_loss(self, loss):
        return loss

    def save_own_variables(self, store) -> None:
        """Its own variables only (step counter, loss scale, `skipped_steps`): Keras's
        `LossScaleOptimizer` would also store the inner optimizer's here, which are saved under
        ``inner_optimizer`` as well: every checkpoint would hold the optimizer state twice."""
        for i, variable in enumerate(self._variables):
            store[str(i)] = keras.ops.convert_to_numpy(variable)

    def load_own_variables(self, store) -> None:
        """Its own variables from a checkpoint of this class: its own alone, or (files written
        before `save_own_variables` existed) its own followed by the inner optimizer's, which
        load from ``inner_optimizer``. Any other count is refused: a silent skip would resume
        with a fresh optimizer."""
        count = len(store.keys())
        if count < len(self._variables):  # saved before it was built (a compiled, untrained
            warnings.warn(f"optimizer {self.name!r}: the file holds {count} of its "  # model)
                          f"{len(self._variables)} variables (saved before its first step): its "
                          "state starts afresh", UserWarning, stacklevel=2)
            return
        if count not in (len(self._variables), len(self.variables)):
            raise ValueError(f"optimizer {self.name!r}: the checkpoint holds {count} variables, "
                             f"expected {len(self._variables)} (or {len(self.variables)}): it is "
                             "not a checkpoint of this optimizer")
        for i, variable in enumerate(self._variables):
            variable.assign(store[str(i)])

    def _stateful_handle_finite_grads(self, grads, trainable_variables):
        self.inner_optimizer.apply(grads, trainable_variables=trainable_variables)

    def _stateful_handle_non_finite_grads(self):
        self.skipped_steps.assign_add(1)

    def _stateless_handle_non_finite_grads(self, optimizer_variables, trainable_variables):
        """The JAX (stateless) path: count the skipped step, change nothing else (Keras would
        halve the loss scale, which would then double every later gradient)."""
        mapping = list(zip(self.variables, optimizer_variables, strict=True))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            self.skipped_steps.assign_add(1)
        return trainable_variables, [scope.get_current_value(v) for v in self.variables]


def build_optimizer(name: str, schedule, *, momentum: float = 0.9, beta_1: float = 0.9,
                    beta_2: float = 0.999, weight_decay: float = 0.0,
                    weight_decay_mode: str = "l2", mixed_float16: bool = False):
    """The stage's optimiser: Adam or SGD Nesterov, wrapped to skip non-finite steps.

    With `weight_decay_mode="l2"` the optimiser itself does no decay: call `add_l2_decay` on the
    model instead (PyTorch's `weight_decay`, which the AETv1 code and the paper's settings mean).
    """
    decoupled = weight_decay if weight_decay_mode == "decoupled" and weight_decay > 0 else None
    if name == "adam":
        inner = keras.optimizers.Adam(schedule, beta_1=beta_1, beta_2=beta_2,
                                      weight_decay=decoupled)
    elif name == "sgd":
        inner = keras.optimizers.SGD(schedule, momentum=momentum, nesterov=True,
                                     weight_decay=decoupled)
    else:
        raise ValueError(f"unknown optimizer {name!r}: use \"adam\" or \"sgd\"")
    if mixed_float16:
        return keras.optimizers.LossScaleOptimizer(inner)
    return SkipNonFinite(inner)


def add_l2_decay(model: keras.Model, weight_decay: float) -> int:
    """Adds `weight_decay / 2 * ||w||^2` of every trainable weight to `model.losses`.

    Its gradient is `weight_decay * w`: PyTorch's coupled `weight_decay`, which the AETv1 code
    applies to every parameter (kernels, biases and BatchNorm's gamma and beta alike).
    Returns the number of decayed weights.
    """
    if weight_decay <= 0:
        return 0
    for weight in model.trainable_weights:
        weight.regularizer = keras.regularizers.L2(weight_decay / 2.0)
    return len(model.trainable_weights)
