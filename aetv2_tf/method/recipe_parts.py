"""The two parts of a pretraining recipe (`recipes.Recipe`) as small frozen values that build
the Keras objects: `LossSpec` (which pretext loss, with its weights and frame) and
`OptimizerSpec` (the optimizer, its learning-rate schedule and weight decay)."""

from __future__ import annotations

import dataclasses
import numbers
import warnings
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from aetv2_tf.data.sampler import parameter_std
from aetv2_tf.errors import SettingWarning


def _one_of(owner: str, name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{owner} {name}={value!r}: one of {allowed}")


@dataclasses.dataclass(frozen=True)
class LossSpec:
    """The pretext loss: ``kind`` "geodesic" (AETv2, `losses.GeodesicLoss`, whose arguments
    the geodesic fields are; ``frame`` "model", scaled by ``frame_scale``, or "pixel") or "mse"
    (AETv1, `losses.ParameterMSELoss`: ``mse_normalize`` divides by the sampler's parameter std;
    ``mse_target`` "model" or "official", `geometry.aetv1_official_targets`)."""

    kind: str = "geodesic"
    projection_weight: float = 1.0
    angle_power: int = 1
    residual_scale: float = 0.0
    chordal_weight: float = 0.0
    mse_weight: float = 0.0
    mse_decay_steps: int = 0
    frame: str = "model"
    frame_scale: float = 1.0
    residual_frame: str = "loss"
    mse_normalize: bool = True
    mse_target: str = "model"
    projection: str = "svd"

    def __post_init__(self) -> None:
        for name, allowed in (("kind", ("geodesic", "mse")), ("frame", ("model", "pixel")),
                              ("projection", ("svd", "newton")),
                              ("residual_frame", ("loss", "unit")),
                              ("mse_target", ("model", "official")), ("angle_power", (1, 2))):
            _one_of("LossSpec", name, getattr(self, name), allowed)
        if self.mse_target == "official" and self.kind != "mse":
            raise ValueError("LossSpec mse_target='official' is the AETv1 MSE's: needs "
                             "kind='mse'")
        if self.frame_scale <= 0 or min(self.projection_weight, self.residual_scale,
                                         self.chordal_weight, self.mse_weight) < 0:
            raise ValueError("LossSpec needs frame_scale > 0 and non-negative weights")

    @property
    def official(self) -> bool:
        """The AETv1 code's own targets: the decoder regresses them (`build_aet_model`)."""
        return self.kind == "mse" and self.mse_target == "official"

    @property
    def decoder_scaled(self) -> bool:
        """Whether the decoder regresses std-normalised parameters by default (the AETv1 MSE on
        model-frame parameters: else SGD at lr 0.1 diverges)."""
        return self.kind == "mse" and self.mse_target == "model"

    @property
    def counts_steps(self) -> bool:
        """Whether the loss reads the training step (an MSE warm-up)."""
        return self.kind == "geodesic" and self.mse_decay_steps > 0

    def frame_matrix(self, image_size: int) -> list[list[float]] | None:
        """The 3x3 frame the geodesic loss projects in (None: the model frame itself)."""
        if self.frame == "pixel":
            n = np.asarray([[2.0 / image_size, 0.0, -(image_size - 1.0) / image_size],
                            [0.0, 2.0 / image_size, -(image_size - 1.0) / image_size],
                            [0.0, 0.0, 1.0]], np.float32)
            return np.linalg.inv(n).tolist()  # model frame -> pixels (conventions.md)
        if self.frame_scale == 1.0:
            return None
        return np.diag([self.frame_scale, self.frame_scale, 1.0]).tolist()

    def decoder_options(self, image_size: int, shift: str = "integer",
                        decoder_scale: bool | None = None,
                        param_std: Sequence[float] | None = None) -> dict[str, Any]:
        """The decoder's ``param_scale`` (when `decoder_scaled` or ``decoder_scale``:
        ``param_std``, default `parameter_std(image_size, shift)`; else None) and ``target``."""
        scaled = self.decoder_scaled if decoder_scale is None else bool(decoder_scale)
        if scaled and self.official:
            raise ValueError("mse_target='official' regresses the AETv1 code's own normalised "
                             "targets: no decoder_scale")
        if scaled and param_std is None:
            param_std = parameter_std(image_size, shift)
        return {"param_scale": param_std if scaled else None,
                "target": "official" if self.official else "model"}

    def build(self, image_size: int | Sequence[int], param_std: Sequence[float] | None = None,
              step: Any = None, shift: str = "integer") -> keras.losses.Loss:
        """The Keras loss for ``image_size`` x ``image_size`` images (`square_side`).
        ``param_std``: the (8,) std the MSE divides by (None: `parameter_std`); ``step``: the
        variable an MSE warm-up reads (required when `counts_steps`)."""
        from aetv2_tf.method.losses import GeodesicLoss, ParameterMSELoss

        image_size = square_side(image_size)
        if self.counts_steps and step is None:
            raise ValueError("this loss's MSE warm-up (mse_decay_steps > 0) reads the training "
                             "step: pass step=model.loss_step of a pretext model built by "
                             "recipe.build_model (or build_pairs_model(..., count_steps=True))")
        if self.official:
            return ParameterMSELoss(target="official", image_size=image_size)
        needs_std = self.mse_normalize if self.kind == "mse" else self.mse_weight > 0
        if param_std is None and needs_std:
            param_std = parameter_std(image_size, shift)
        if self.kind == "mse":
            return ParameterMSELoss(std=param_std if self.mse_normalize else None)
        loss = GeodesicLoss(self.projection_weight, angle_power=self.angle_power,
                            residual_scale=self.residual_scale,
                            chordal_weight=self.chordal_weight, mse_weight=self.mse_weight,
                            mse_std=param_std, mse_decay_steps=self.mse_decay_steps,
                            frame=self.frame_matrix(image_size),
                            residual_frame=self.residual_frame, projection=self.projection)
        loss.step = step
        return loss


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """The optimizer: ``name`` "adam" or "sgd" (Nesterov), the peak ``learning_rate`` and its
    `optimizers.Schedule` (``lr_schedule``, ``warmup_steps``, ``lr_drop_epochs`` of a run of
    ``epochs`` epochs, () = at 30/60/80 % of the run, ``lr_drop_factor``), ``weight_decay`` and
    ``weight_decay_mode`` ("l2": PyTorch's coupled decay; "decoupled": Keras's)."""

    name: str = "adam"
    learning_rate: float = 1e-5
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    lr_drop_epochs: tuple[int, ...] = ()
    lr_drop_factor: float = 0.2
    momentum: float = 0.9
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    weight_decay: float = 5e-4
    weight_decay_mode: str = "l2"
    epochs: int = 0

    def __post_init__(self) -> None:
        for name, allowed in (("name", ("adam", "sgd")),
                              ("lr_schedule", ("constant", "aetv1", "cosine", "step")),
                              ("weight_decay_mode", ("l2", "decoupled"))):
            _one_of("OptimizerSpec", name, getattr(self, name), allowed)
        if self.learning_rate <= 0 or self.weight_decay < 0 or self.warmup_steps < 0:
            raise ValueError(f"OptimizerSpec needs learning_rate > 0, weight_decay >= 0 and "
                             f"warmup_steps >= 0; got {self.learning_rate}, {self.weight_decay}, "
                             f"{self.warmup_steps}")
        drops = tuple(int(e) for e in self.lr_drop_epochs)
        if drops and (self.lr_schedule != "step" or list(drops) != sorted(set(drops))
                      or drops[0] < 1 or self.epochs < 1):
            raise ValueError(f"OptimizerSpec: lr_drop_epochs={drops} needs lr_schedule='step', "
                             f"increasing epochs from 1 on and the run's epochs >= 1; got "
                             f"lr_schedule={self.lr_schedule!r}, epochs={self.epochs}")
        object.__setattr__(self, "lr_drop_epochs", drops)

    def build(self, steps: int, mixed_float16: bool | None = None, *,
              _stacklevel: int = 2) -> tuple[Any, keras.optimizers.Optimizer]:
        """``(schedule, optimizer)`` for a run of ``steps`` optimizer steps, touching no model
        (build it in the model's distribution scope). ``mixed_float16``: wrap for loss scaling
        (None: from the dtype policy). A warm-up over half the run warns (`SettingWarning`)."""
        from aetv2_tf.method import optimizers

        schedule = optimizers.Schedule(self.lr_schedule, self.learning_rate, steps,
                                       self.warmup_steps, drop_factor=self.lr_drop_factor,
                                       drop_epochs=self.lr_drop_epochs, epochs=self.epochs)
        if self.warmup_steps > int(steps) // 2:
            shorter, longer = int(steps) // 10, 2 * self.warmup_steps
            warnings.warn(SettingWarning(
                f"warmup_steps={self.warmup_steps} in a run of {int(steps)} steps: the learning "
                f"rate peaks at {schedule.reached_peak():.3g}, not at learning_rate="
                f"{self.learning_rate:.3g}; shorten the warm-up (to {shorter}, say), or train "
                f"for at least {longer} steps", ("warmup_steps", "steps")),
                stacklevel=_stacklevel)
        if mixed_float16 is None:
            mixed_float16 = keras.mixed_precision.dtype_policy().name == "mixed_float16"
        optimizer = optimizers.build_optimizer(
            self.name, schedule, momentum=self.momentum, beta_1=self.adam_beta1,
            beta_2=self.adam_beta2, weight_decay=self.weight_decay,
            weight_decay_mode=self.weight_decay_mode, mixed_float16=mixed_float16)
        return schedule, optimizer


def square_side(image_size: int | Sequence[int]) -> int:
    """The side of square images: a positive int, or ``(side, side)``; else a ValueError."""
    if isinstance(image_size, Sequence) and not isinstance(image_size, str) \
            and len(image_size) == 2 and image_size[0] == image_size[1]:
        image_size = image_size[0]
    if isinstance(image_size, numbers.Integral) and not isinstance(image_size, bool) \
            and image_size > 0:
        return int(image_size)
    raise ValueError(f"image_size must be a positive int, the side of square images (or a "
                     f"square (side, side), read as its side): the loss frames and the "
                     f"parameter std are defined for square images only; got {image_size!r}")
