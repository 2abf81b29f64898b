"""Optimisers, learning-rate schedules and weight decay for every stage.

Schedules are functions of the optimiser's step counter only: a resumed run continues exactly.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
from keras import ops

# The AETv1 CIFAR table (1500 epochs) as fractions of the run: x1, x0.2 from epoch 240, x0.04 from
# 480, x0.008 from 640, x0.0016 from 800, then linear decay from 1000 to x1e-4.
AETV1_BOUNDARIES = (240 / 1500, 480 / 1500, 640 / 1500, 800 / 1500)
AETV1_MULTIPLIERS = (1.0, 0.2, 0.04, 0.008, 0.0016)
AETV1_DECAY_START, AETV1_FINAL_MULTIPLIER = 1000 / 1500, 1e-4
#: `step`'s default drops, as fractions of the run (the probe heads' 30%, 60%, 80%).
STEP_DROPS = (0.3, 0.6, 0.8)


@keras.saving.register_keras_serializable(package="aetv2_tf")
class Schedule(keras.optimizers.schedules.LearningRateSchedule):
    """Learning rate at a step: `constant`, `aetv1`, `cosine` or `step`, with linear warm-up.

    `step` multiplies by `drop_factor` at each fraction `drops` of `total_steps` or, given
    `drop_epochs` of a run of `epochs` epochs, from step ``ceil(e * total_steps / epochs)``
    (`drop_steps`).
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
        """The largest learning rate of steps ``0 .. total_steps - 1`` (below `peak` when the
        warm-up is cut short or overlaps the decay)."""
        if self.warmup_steps <= 0:
            return self.peak
        steps = np.arange(min(self.warmup_steps, self.total_steps), dtype=np.float32)
        return float(np.max(ops.convert_to_numpy(self(steps))))

    def get_config(self) -> dict:
        return dict(kind=self.kind, peak=self.peak, total_steps=self.total_steps,
                    warmup_steps=self.warmup_steps, drops=list(self.drops),
                    drop_factor=self.drop_factor, drop_epochs=list(self.drop_epochs),
                    epochs=self.epochs)


class CoupledWeightDecay:
    """Mixin of a Keras optimizer (first in the bases): PyTorch's coupled ``weight_decay``.

    ``g <- g + l2_decay * w`` for every updated variable before the update rule sees the
    gradient, as ``torch.optim`` does: the gradient of ``l2_decay / 2 * ||w||^2`` (`l2_penalty`,
    shown, never added to the loss). Added in `update_step`: once, to the all-reduced gradient.
    """

    def __init__(self, *args: Any, l2_decay: float = 0.0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if not float(l2_decay) >= 0.0:
            raise ValueError(f"l2_decay must be >= 0; got {l2_decay!r}")
        self.l2_decay = float(l2_decay)

    def update_step(self, gradient, variable, learning_rate):
        if self.l2_decay > 0:
            decay = ops.multiply(ops.cast(variable, gradient.dtype), self.l2_decay)
            gradient = ops.add(gradient, decay)
        super().update_step(gradient, variable, learning_rate)

    def get_config(self) -> dict:
        return {**super().get_config(), "l2_decay": self.l2_decay}


@keras.saving.register_keras_serializable(package="aetv2_tf")
class AdamL2(CoupledWeightDecay, keras.optimizers.Adam):
    """`keras.optimizers.Adam` with PyTorch's coupled weight decay ``l2_decay``
    (`CoupledWeightDecay`): ``torch.optim.Adam(weight_decay=l2_decay)``, Keras's epsilon."""


@keras.saving.register_keras_serializable(package="aetv2_tf")
class SGDL2(CoupledWeightDecay, keras.optimizers.SGD):
    """`keras.optimizers.SGD` with PyTorch's coupled weight decay ``l2_decay``
    (`CoupledWeightDecay`): ``torch.optim.SGD(momentum, nesterov, weight_decay=l2_decay)``."""


def coupled_l2_decay(optimizer: Any) -> float:
    """The coupled L2 decay ``optimizer`` adds to its gradients (`CoupledWeightDecay`), through
    wrappers with an ``inner_optimizer``; 0 for any other optimizer or none."""
    while optimizer is not None and not isinstance(optimizer, CoupledWeightDecay):
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return optimizer.l2_decay if optimizer is not None else 0.0


def l2_penalty(variables: Sequence, l2_decay: float):
    """``l2_decay / 2 * sum ||w||^2`` over ``variables`` (a float32 scalar tensor): the penalty
    whose gradient `CoupledWeightDecay` adds, for display."""
    total = ops.sum(ops.stack([ops.sum(ops.square(ops.cast(v, "float32"))) for v in variables]))
    return ops.multiply(total, l2_decay / 2.0)


#: `LossScaleOptimizer`'s settings a `SkipNonFinite` config may name (accepted, unused), and the
#: loss scale's variables a checkpoint may hold after its own three.
LOSS_SCALE_CONFIG = ("initial_scale", "dynamic_growth_steps")
LOSS_SCALE_VARIABLES = 2


@keras.saving.register_keras_serializable(package="aetv2_tf")
class SkipNonFinite(keras.optimizers.Optimizer):
    """Wraps ``inner_optimizer``: a step is applied only when every gradient is finite;
    otherwise nothing changes (weights, slots, ``iterations``) and `skipped_steps` grows by one.

    ``apply`` (TensorFlow, eager) and ``stateless_apply`` (JAX); under `tf.distribute` the
    replicas agree (all-reduced count, cross-replica ``cond``). ``learning_rate`` and
    ``iterations`` are the inner optimizer's. A checkpoint holds its own variables under
    ``optimizer``, the inner's under ``optimizer/inner_optimizer``.
    """

    def __init__(self, inner_optimizer: keras.optimizers.Optimizer, name: str | None = None,
                 **loss_scale: Any):
        unknown = set(loss_scale) - set(LOSS_SCALE_CONFIG)
        if unknown:
            raise TypeError(f"SkipNonFinite takes inner_optimizer and name; got {sorted(unknown)}")
        super().__init__(learning_rate=0.0, name=name)
        self.inner_optimizer = inner_optimizer

    def build(self, var_list) -> None:
        self.skipped_steps = self.add_variable(
            shape=(), dtype="int", initializer="zeros", aggregation="none",
            name="skipped_steps")
        self.inner_optimizer.build(var_list)
        super().build(var_list)

    @property
    def own_variables(self) -> list:
        """Iteration and learning rate (unused: the inner's), `skipped_steps`."""
        return super().variables

    @property
    def variables(self) -> list:
        return [*self.own_variables, *self.inner_optimizer.variables]

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate) -> None:
        self.inner_optimizer.learning_rate = learning_rate

    def finalize_variable_values(self, var_list) -> None:
        self.inner_optimizer.finalize_variable_values(var_list)

    def apply(self, grads, trainable_variables=None) -> None:
        if not self.built:
            self.build(trainable_variables)
        grads = list(grads)
        finite = all_finite(grads)
        if keras.backend.backend() == "tensorflow":
            self._tf_apply(finite, grads, trainable_variables)
        elif bool(ops.convert_to_numpy(finite)):  # eager (a JAX step is `stateless_apply`)
            self.inner_optimizer.apply(grads, trainable_variables)
        else:
            self.skipped_steps.assign_add(1)

    def _tf_apply(self, finite, grads, trainable_variables) -> None:
        """TensorFlow: a ``cond`` on ``finite``; under a strategy on the all-reduced verdicts,
        in cross-replica context (the inner update merges the replicas)."""
        import tensorflow as tf

        def step():
            self.inner_optimizer.apply(grads, trainable_variables)

        def skip():
            self.skipped_steps.assign_add(1)

        if not tf.distribute.has_strategy():
            ops.cond(finite, step, skip)
            return
        context = tf.distribute.get_replica_context()
        if context is None:
            raise ValueError("SkipNonFinite.apply must be called in a replica context "
                             "(inside strategy.run, as model.fit does)")
        non_finite = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                        ops.cast(ops.logical_not(finite), "float32"))

        def cross_replica(strategy, non_finite, grads):
            agreed = ops.equal(strategy.experimental_local_results(non_finite)[0], 0.0)
            ops.cond(agreed, lambda: strategy.run(
                lambda g: self.inner_optimizer.apply(g, trainable_variables), args=(grads,)),
                skip)

        context.merge_call(cross_replica, args=(non_finite, grads))

    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        """JAX: ``(trainable values, optimizer values)`` after the inner ``stateless_apply``
        if every gradient is finite, else unchanged with `skipped_steps` one higher."""
        own_variables = self.own_variables
        own_values = list(optimizer_variables[:len(own_variables)])
        inner_values = optimizer_variables[len(own_variables):]

        def step():
            new_trainable, new_inner = self.inner_optimizer.stateless_apply(
                inner_values, grads, trainable_variables)
            return list(new_trainable), [*own_values, *new_inner]

        def skip():
            mapping = list(zip(own_variables, own_values, strict=True))
            with keras.StatelessScope(state_mapping=mapping) as scope:
                self.skipped_steps.assign_add(1)
            return list(trainable_variables), [
                *(scope.get_current_value(v) for v in own_variables), *inner_values]

        return ops.cond(all_finite(grads), step, skip)

    def save_own_variables(self, store) -> None:
        """Its own variables (the inner optimizer saves its own under ``inner_optimizer``)."""
        for i, variable in enumerate(self.own_variables):
            store[str(i)] = ops.convert_to_numpy(variable)

    def load_own_variables(self, store) -> None:
        """Its own three variables, from a group of 3 or 5 (a loss-scaling wrapper's layout,
        the last two not read), either possibly followed by the inner optimizer's. Fewer (saved
        before the first step): a fresh state with a warning; other counts are refused."""
        count, own = len(store.keys()), len(self.own_variables)
        if count < own:
            warnings.warn(f"optimizer {self.name!r}: the file holds {count} of its {own} "
                          "variables (saved before its first step): its state starts afresh",
                          UserWarning, stacklevel=2)
            return
        inner = len(self.inner_optimizer.variables)
        layouts = (own, own + LOSS_SCALE_VARIABLES)
        if count not in (*layouts, *(n + inner for n in layouts)):
            raise ValueError(f"optimizer {self.name!r}: the checkpoint holds {count} variables, "
                             f"expected {' or '.join(map(str, layouts))} (or with the inner "
                             f"optimizer's {inner} after them): it is not a checkpoint of this "
                             "optimizer")
        for i, variable in enumerate(self.own_variables):
            variable.assign(store[str(i)])

    def get_config(self) -> dict:
        return {"name": self.name,
                "inner_optimizer": keras.saving.serialize_keras_object(self.inner_optimizer)}

    @classmethod
    def from_config(cls, config: dict, custom_objects=None) -> SkipNonFinite:
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("inner_optimizer"),
                                                      custom_objects=custom_objects)
        return cls(inner, **config)


def all_finite(grads: Sequence):
    """Whether every value of every gradient (None: none) is finite, a boolean scalar."""
    checks = [ops.all(ops.isfinite(g)) for g in grads if g is not None]
    return ops.all(ops.stack(checks)) if checks else ops.convert_to_tensor(True)


def build_optimizer(name: str, schedule, *, momentum: float = 0.9, beta_1: float = 0.9,
                    beta_2: float = 0.999, weight_decay: float = 0.0,
                    weight_decay_mode: str = "l2", mixed_float16: bool = False):
    """Adam or SGD Nesterov with the weight decay, wrapped to skip non-finite steps
    (`SkipNonFinite`; under ``mixed_float16``, Keras's loss scaling). ``weight_decay_mode``:
    "l2" (PyTorch's coupled decay, `CoupledWeightDecay`) or "decoupled" (Keras's)."""
    if weight_decay_mode not in ("l2", "decoupled"):
        raise ValueError(f"unknown weight_decay_mode {weight_decay_mode!r}: l2 or decoupled")
    coupled = weight_decay_mode == "l2"
    decay = {"l2_decay": weight_decay if coupled else 0.0,
             "weight_decay": weight_decay if not coupled and weight_decay > 0 else None}
    if name == "adam":
        inner = AdamL2(schedule, beta_1=beta_1, beta_2=beta_2, **decay)
    elif name == "sgd":
        inner = SGDL2(schedule, momentum=momentum, nesterov=True, **decay)
    else:
        raise ValueError(f"unknown optimizer {name!r}: use \"adam\" or \"sgd\"")
    if mixed_float16:
        return keras.optimizers.LossScaleOptimizer(inner)
    return SkipNonFinite(inner)
