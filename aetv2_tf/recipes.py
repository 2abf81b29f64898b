"""Pretraining recipes as values: the loss with its frame, the optimizer, its schedule and the
weight decay, and what they need of the model, in one frozen dataclass that builds them.

    recipe = aetv2_tf.recipes.AETV2                       # the AETv2 recipe
    model = recipe.build_model(encoder, seed=0)           # build_pairs_model, as the CLI builds it
    recipe.compile(model, steps=training_steps(len(images), 64, epochs=1))
    model.fit(images, batch_size=64, epochs=1)

`Recipe.build_model` decides what the recipe needs of the decoder (the AETv1 MSE's parameter
scale, the official targets, the step counter of an MSE warm-up) and `Recipe.compile` reads the
image size (and that scale) back from the model, so the loss frame, the parameter std and the
model cannot disagree. The parts stay public: ``recipe.build_loss(image_size=32)``,
``recipe.build_optimizer(model, steps)`` and ``recipe.metrics()``.

`AETV2` (configs/cifar10_aetv2.cfg: the squared geodesic angle in the 4x zoomed model frame plus
10 x the projection residual of the error in the unit frame, Adam 1e-4 with warm-up and cosine
decay, L2 decay 5e-4: the best AETv2 measured, docs/reproduction.md), `AETV2_PAPER` (the paper's
literal Eq. 11, lambda = 1, Adam 1e-5 constant: below a random init in our measurements) and
`AETV1` (the std-normalised parameter MSE, SGD Nesterov 0.1 on the AETv1 code's piecewise
schedule) are the three of the paper's tables. `AETV2_ZOOM16` is the default AETv2 of versions
before 0.2 (the angle in the 16x zoomed frame, no residual: blind to scale, shear and keystone
errors); `AETV2_SQ4` and `AETV2_HYBRID` are the variants screened beside `AETV2`
(docs/reproduction.md, "AETv2 that earns its name"; `AETV2_SQ4_UNITRES` is `AETV2`'s earlier name).
Change a field with ``dataclasses.replace(AETV2, learning_rate=3e-4)``.

The command line builds the same objects: `Recipe.from_flags` reads the flags into a recipe, and
the program compiles what `build_loss` / `build_optimizer` return (one path, not two).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import warnings
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from aetv2_tf.data.sampler import parameter_std
from aetv2_tf.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A pretraining recipe (module docstring). Fields are the flags of the same names.

    Loss: ``loss`` "geodesic" (AETv2, `losses.GeodesicLoss`) or "mse" (AETv1,
    `losses.ParameterMSELoss`); the geodesic loss's ``projection_weight`` (lambda of Eq. 11),
    ``angle_power``, ``residual_scale``, ``chordal_weight``, ``mse_weight`` and
    ``mse_decay_steps``; its frame: ``frame`` "model" (centred, normalised; its coordinates
    multiplied by ``frame_scale``) or "pixel"; ``residual_frame``: "loss" (the projection
    residual in that frame, as the angle) or "unit" (the residual of ``M`` in the unit model
    frame, the angle in the zoomed one); ``mse_normalize``: the MSE divides by the
    parameters' std under the sampler (AETv1); ``mse_target``: "model" (the MSE on T's
    model-frame parameters) or "official" (on the published AETv1 code's own targets, PIL's
    inverse map normalised by its fixed constants, `geometry.aetv1_official_targets`; the model
    is then built with ``build_aet_model(..., target="official")``). The optimizer:
    ``optimizer`` "adam" or "sgd" (Nesterov), ``learning_rate`` (peak), ``lr_schedule``
    ("constant", "aetv1", "cosine", "step"), ``warmup_steps``, ``lr_drops`` (fractions of the
    run for "step"; () = 30/60/80 %), ``lr_drop_factor``, ``momentum``, ``adam_beta1/2``,
    ``weight_decay`` and ``weight_decay_mode`` ("l2": added to the model's losses, as
    PyTorch; "decoupled").
    """

    loss: str = "geodesic"
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
    optimizer: str = "adam"
    learning_rate: float = 1e-5
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    lr_drops: tuple[float, ...] = ()
    lr_drop_factor: float = 0.2
    momentum: float = 0.9
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    weight_decay: float = 5e-4
    weight_decay_mode: str = "l2"

    def __post_init__(self) -> None:
        for name, allowed in (("loss", ("geodesic", "mse")), ("frame", ("model", "pixel")),
                              ("residual_frame", ("loss", "unit")),
                              ("mse_target", ("model", "official")),
                              ("optimizer", ("adam", "sgd")),
                              ("lr_schedule", ("constant", "aetv1", "cosine", "step")),
                              ("weight_decay_mode", ("l2", "decoupled"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"Recipe {name}={getattr(self, name)!r}: one of {allowed}")
        if self.mse_target == "official" and self.loss != "mse":
            raise ValueError("Recipe mse_target='official' is the AETv1 MSE's: needs loss='mse'")
        if self.learning_rate <= 0 or self.frame_scale <= 0 or self.weight_decay < 0:
            raise ValueError("Recipe needs learning_rate > 0, frame_scale > 0 and "
                             f"weight_decay >= 0; got {self.learning_rate}, {self.frame_scale}, "
                             f"{self.weight_decay}")

    # ------------------------------------------------------------------------------- the loss
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

    def build_loss(self, image_size: int | Sequence[int], param_std: Sequence[float] | None = None,
                   step: Any = None, shift: str = "integer") -> keras.losses.Loss:
        """The loss, for ``image_size`` x ``image_size`` images (a positive int; a square
        ``(side, side)`` is read as its side, anything else is refused).

        ``param_std``: the (8,) std of the sampler's parameters, which the AETv1 MSE (and the
        geodesic loss's MSE term) divide by; None computes it for ``image_size`` and ``shift``
        (`parameter_std`). ``step``: the variable an MSE warm-up (``mse_decay_steps``) reads,
        e.g. ``optimizer.iterations`` under TensorFlow, or ``build_pairs_model(...,
        count_steps=True)``'s ``model.loss_step`` on any backend; required when
        ``mse_decay_steps > 0``.
        """
        from aetv2_tf.losses import GeodesicLoss, ParameterMSELoss

        image_size = square_side(image_size)
        if self.loss == "geodesic" and self.mse_decay_steps > 0 and step is None:
            raise ValueError("this recipe's MSE warm-up (mse_decay_steps > 0) reads the training "
                             "step: pass step=optimizer.iterations (TensorFlow) or a pairs "
                             "model's loss_step (build_pairs_model(..., count_steps=True))")
        if self.loss == "mse" and self.mse_target == "official":
            return ParameterMSELoss(target="official", image_size=image_size)
        needs_std = self.mse_normalize if self.loss == "mse" else self.mse_weight > 0
        if param_std is None and needs_std:
            param_std = parameter_std(image_size, shift)
        if self.loss == "mse":
            return ParameterMSELoss(std=param_std if self.mse_normalize else None)
        loss = GeodesicLoss(self.projection_weight, angle_power=self.angle_power,
                            residual_scale=self.residual_scale,
                            chordal_weight=self.chordal_weight, mse_weight=self.mse_weight,
                            mse_std=param_std, mse_decay_steps=self.mse_decay_steps,
                            frame=self.frame_matrix(image_size),
                            residual_frame=self.residual_frame)
        loss.step = step
        return loss

    @staticmethod
    def metrics() -> list[keras.metrics.Metric]:
        """The pretext metrics: geodesic angle (degrees), projection residual, rotation
        accuracy (`aetv2_tf.metrics`; registered, so a saved model reloads)."""
        from aetv2_tf.metrics import pretext_metrics

        return pretext_metrics()

    # -------------------------------------------------------------------------- the optimizer
    def build_optimizer(self, model: keras.Model, steps: int,
                        mixed_float16: bool | None = None, *, _stacklevel: int = 2):
        """``(schedule, optimizer)`` for a run of ``steps`` optimizer steps (`training_steps`:
        ``epochs * ceil(examples / batch_size)``; the schedules are fractions of it).
        ``weight_decay_mode="l2"`` adds the decay to ``model``'s losses (once per model); call
        inside a distribution scope. ``mixed_float16``: wrap for loss scaling (None: from
        Keras's dtype policy). A warm-up longer than half the run warns (`UserWarning`) with
        the learning rate the run will really reach; the schedule is kept as asked."""
        from aetv2_tf import optim

        if self.weight_decay_mode == "l2":
            optim.add_l2_decay(model, self.weight_decay)
        schedule = optim.Schedule(self.lr_schedule, self.learning_rate, steps,
                                  self.warmup_steps, drops=self.lr_drops or optim.STEP_DROPS,
                                  drop_factor=self.lr_drop_factor)
        if self.warmup_steps > int(steps) // 2:
            warnings.warn(
                f"warmup_steps={self.warmup_steps} in a run of {int(steps)} steps: the learning "
                f"rate peaks at {schedule.reached_peak():.3g}, not at learning_rate="
                f"{self.learning_rate:.3g}; shorten the warm-up, e.g. dataclasses.replace("
                f"recipe, warmup_steps={int(steps) // 10}), or train for at least "
                f"{2 * self.warmup_steps} steps", UserWarning, stacklevel=_stacklevel)
        if mixed_float16 is None:
            mixed_float16 = keras.mixed_precision.dtype_policy().name == "mixed_float16"
        optimizer = optim.build_optimizer(
            self.optimizer, schedule, momentum=self.momentum, beta_1=self.adam_beta1,
            beta_2=self.adam_beta2, weight_decay=self.weight_decay,
            weight_decay_mode=self.weight_decay_mode, mixed_float16=mixed_float16)
        return schedule, optimizer

    # ------------------------------------------------------------------- the model, compiled
    @property
    def decoder_scaled(self) -> bool:
        """Whether the decoder regresses std-normalised parameters: the AETv1 MSE on the model
        frame's parameters (the command line's ``--decoder_scale`` default; without it SGD at
        lr 0.1 diverges within a few steps)."""
        return self.loss == "mse" and self.mse_target == "model"

    def decoder_options(self, image_size: int, shift: str = "integer",
                        decoder_scale: bool | None = None,
                        param_std: Sequence[float] | None = None) -> dict[str, Any]:
        """The decoder's ``param_scale`` and ``target``: keyword arguments of `build_aet_model`
        and `build_pairs_model`, the one rule of this recipe, the command line and `build_model`.

        ``param_scale``: the (8,) parameter std when `decoder_scaled` (``decoder_scale``: True /
        False overrides, as ``--decoder_scale``), ``param_std`` if given (a backend's own
        sampler's numbers), else `parameter_std` of ``image_size`` and ``shift``; else None.
        ``target``: ``"official"`` for ``mse_target="official"`` (the AETv1 code's own
        normalised targets, never scaled), else ``"model"``."""
        official = self.loss == "mse" and self.mse_target == "official"
        scaled = self.decoder_scaled if decoder_scale is None else bool(decoder_scale)
        if scaled and official:
            raise ValueError("mse_target='official' regresses the AETv1 code's own normalised "
                             "targets: no decoder_scale")
        if scaled and param_std is None:
            param_std = parameter_std(image_size, shift)
        return {"param_scale": param_std if scaled else None,
                "target": "official" if official else "model"}

    def build_model(self, encoder: keras.Model, seed: int = 0, *, shift: str = "integer",
                    decoder_scale: bool | None = None, **kwargs: Any) -> keras.Model:
        """The pairs model (`models.pairs.build_pairs_model`: uint8 images in, pairs made on
        the device) with what the recipe decides, as the command line builds it: the decoder's
        ``param_scale`` and ``target`` (`decoder_options` of the encoder's image size and
        ``shift``; ``decoder_scale``: True / False overrides, as ``--decoder_scale``),
        ``count_steps=True`` for an MSE warm-up (``mse_decay_steps > 0``). ``seed``: the pairs'
        sampler; other keyword arguments (``augment``, ``mean``, ``std``,
        ``init_rotation_deg``, ...) pass through."""
        from aetv2_tf.models.pairs import build_pairs_model

        for name in ("param_scale", "target"):
            if name in kwargs:
                raise TypeError(f"build_model: the recipe decides {name} (decoder_scale=True / "
                                "False overrides the scale); call build_pairs_model to set it")
        options = self.decoder_options(image_size_of(encoder), shift, decoder_scale)
        count_steps = bool(kwargs.pop("count_steps", False)) or self.mse_decay_steps > 0
        return build_pairs_model(encoder, seed, shift=shift, count_steps=count_steps,
                                 **options, **kwargs)

    def compile(self, model: keras.Model, steps: int, *, mixed_float16: bool | None = None,
                **compile_kwargs: Any):
        """``model.compile`` with the recipe's loss, optimizer and metrics; returns the
        learning-rate schedule (the optimizer is ``model.optimizer``).

        ``steps``: the run's number of optimizer steps, ``epochs * ceil(examples /
        batch_size)`` (`training_steps`); the schedule and its warm-up are laid out over it.
        ``model``: an AET pairs model (`build_model` / `build_pairs_model`: a layer "pairs");
        other models (RotNet's `build_rotations_model`) are refused.
        The image size is read from ``model.inputs[0]`` (square images of a known size), the
        parameter std of the loss from the decoder's scale (layer "decoder_scale", so the loss
        divides by the numbers the decoder was scaled by), and an MSE warm-up's step from
        ``model.loss_step`` (`build_model`; under TensorFlow ``optimizer.iterations`` will
        do). Other keyword arguments (``steps_per_execution``, ``jit_compile``) go to
        ``model.compile``."""
        if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps <= 0:
            raise ValueError(f"steps must be the run's number of optimizer steps, a positive "
                             f"int (training_steps(examples, batch_size, epochs)); got {steps!r}")
        size = image_size_of(model)
        layers = _all_layers(model)
        if not any(layer.name == "pairs" for layer in layers):
            raise UsageError(
                f"Recipe.compile: model {model.name!r} has no layer 'pairs' (the homography pairs "
                "of AET): the recipe's loss regresses the transformation of an AET pairs model; "
                "build one with recipe.build_model(encoder) or aetv2_tf.build_pairs_model("
                "encoder, seed=0). A RotNet model (build_rotations_model) is not an AET recipe's: "
                "compile it yourself with a cross-entropy (keras.losses."
                "SparseCategoricalCrossentropy(from_logits=True))")
        scale = next((np.asarray(layer.scale, np.float32) for layer in layers
                      if layer.name == "decoder_scale"), None)
        shift = next((layer.shift for layer in layers
                      if layer.name == "pairs" and hasattr(layer, "shift")), "integer")
        if self.decoder_scaled and scale is None:
            warnings.warn("this recipe's MSE is meant for a decoder that regresses std-"
                          "normalised parameters (the command line's default) and the model "
                          "has none: SGD at its learning rate diverges; build the model with "
                          "recipe.build_model(encoder)", UserWarning, stacklevel=2)
        schedule, optimizer = self.build_optimizer(model, steps, mixed_float16, _stacklevel=3)
        step = getattr(model, "loss_step", None)
        if self.loss == "geodesic" and self.mse_decay_steps > 0 and step is None:
            if keras.backend.backend() != "tensorflow":
                raise ValueError("this recipe's MSE warm-up (mse_decay_steps > 0) reads the "
                                 "step from the model: build it with recipe.build_model(encoder)")
            step = optimizer.iterations
        loss = self.build_loss(size, scale, step, shift)
        model.compile(optimizer=optimizer, loss=loss, metrics=self.metrics(), **compile_kwargs)
        return schedule

    # ------------------------------------------------------------------------- the flags
    @classmethod
    def from_flags(cls, flags: Any, lr_drops: tuple[float, ...] = ()) -> Recipe:
        """The recipe of parsed absl flags (`aetv2_tf.program.flags`); ``lr_drops`` as fractions."""
        return cls(
            loss=flags.loss, projection_weight=flags.projection_weight,
            angle_power=flags.angle_power, residual_scale=flags.residual_scale,
            chordal_weight=flags.chordal_weight, mse_weight=flags.mse_weight,
            mse_decay_steps=flags.mse_decay_steps, frame=flags.loss_frame,
            frame_scale=flags.loss_frame_scale, residual_frame=flags.residual_frame,
            mse_normalize=flags.mse_normalize,
            mse_target=flags.mse_target, optimizer=flags.optimizer,
            learning_rate=flags.learning_rate,
            lr_schedule=flags.lr_schedule, warmup_steps=flags.warmup_steps,
            lr_drops=tuple(lr_drops), lr_drop_factor=flags.lr_drop_factor,
            momentum=flags.momentum, adam_beta1=flags.adam_beta1, adam_beta2=flags.adam_beta2,
            weight_decay=flags.weight_decay, weight_decay_mode=flags.weight_decay_mode)


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


def image_size_of(model: keras.Model) -> int:
    """The side of the square images ``model`` (an encoder or a pretext model) takes, read
    from ``model.inputs[0]`` ``(batch, side, side, channels)``; else a ValueError."""
    shape = tuple(model.inputs[0].shape)
    if len(shape) != 4 or shape[1] is None or shape[1] != shape[2]:
        raise ValueError(f"{model.name!r} takes inputs of shape {shape}: the recipe needs "
                         "square images of a known size, e.g. build_backbone('nin', "
                         "input_shape=(64, 64, 3))")
    return int(shape[1])


def training_steps(examples: int, batch_size: int, epochs: int = 1) -> int:
    """The optimizer steps of ``model.fit(x, batch_size=batch_size, epochs=epochs)`` on
    ``examples`` images: ``epochs * ceil(examples / batch_size)`` (a last, partial batch is a
    step), the ``steps`` of `Recipe.compile` and `Recipe.build_optimizer`."""
    if examples <= 0 or batch_size <= 0 or epochs <= 0:
        raise ValueError(f"examples, batch_size and epochs must be positive; got {examples}, "
                         f"{batch_size}, {epochs}")
    return int(epochs) * math.ceil(examples / batch_size)


def _all_layers(model: keras.Model) -> list[keras.layers.Layer]:
    """Every layer of ``model`` and of the models nested in it, depth first."""
    found = []
    for layer in model.layers:
        found.append(layer)
        if isinstance(layer, keras.Model):
            found.extend(_all_layers(layer))
    return found


#: The paper's literal AETv2 (configs/cifar10_aetv2_paper.cfg): Eq. 11 with lambda = 1.
AETV2_PAPER = Recipe(loss="geodesic", projection_weight=1.0, optimizer="adam",
                     learning_rate=1e-5, lr_schedule="constant", weight_decay=5e-4)
#: AETv1 (configs/cifar10_aetv1.cfg): the std-normalised MSE, SGD Nesterov, AETv1's schedule.
AETV1 = Recipe(loss="mse", mse_normalize=True, optimizer="sgd", momentum=0.9,
               learning_rate=0.1, lr_schedule="aetv1", weight_decay=5e-4)
#: The paper's AETv1 as its published code trains it (configs/cifar10_aetv1_official.cfg): the
#: MSE on its own targets (PIL's inverse map, fixed normalisation), otherwise as `AETV1`.
AETV1_OFFICIAL = dataclasses.replace(AETV1, mse_target="official")

#: theta in the 16x zoomed frame, no residual (configs/cifar10_aetv2_zoom16.cfg): the default
#: AETv2 before version 0.2, and the optimiser and schedule of every AETv2 below.
AETV2_ZOOM16 = Recipe(loss="geodesic", projection_weight=0.0, frame_scale=16.0, optimizer="adam",
                      learning_rate=1e-4, lr_schedule="cosine", warmup_steps=1000,
                      weight_decay=5e-4)
# The squared angle (Eq. 5: 1/2 ||log P||^2 = theta^2) in the 4x zoomed frame; the weights were
# chosen from the gradient shares of `benchmarks.loss_gradients` (the configs' headers say why).
#: theta^2 at 4x, no residual (configs/cifar10_aetv2_sq4.cfg): still blind to T_hat = T S for S
#: symmetric positive definite.
AETV2_SQ4 = dataclasses.replace(AETV2_ZOOM16, angle_power=2, frame_scale=4.0)
#: The AETv2 recipe (configs/cifar10_aetv2.cfg): theta^2 at 4x + 10 ||M - P||_F^2 of M in the
#: UNIT frame, so that scale, shear and keystone errors weigh at their own size.
AETV2 = dataclasses.replace(AETV2_SQ4, projection_weight=10.0, residual_frame="unit")
#: `AETV2`'s name while it was a variant (configs/cifar10_aetv2_sq4_unitres.cfg).
AETV2_SQ4_UNITRES = AETV2
#: A labelled hybrid: theta^2 at 4x + 0.3 x AETv1's normalised parameter MSE
#: (configs/cifar10_aetv2_hybrid.cfg).
AETV2_HYBRID = dataclasses.replace(AETV2_SQ4, mse_weight=0.3)

#: The recipes by name (`as_recipe`): the lower-case names of the values above.
RECIPES = {"aetv2": AETV2, "aetv2_paper": AETV2_PAPER, "aetv1": AETV1,
           "aetv1_official": AETV1_OFFICIAL, "aetv2_zoom16": AETV2_ZOOM16,
           "aetv2_sq4": AETV2_SQ4, "aetv2_sq4_unitres": AETV2_SQ4_UNITRES,
           "aetv2_hybrid": AETV2_HYBRID}


def as_recipe(value: Recipe | str) -> Recipe:
    """``value`` if it is a `Recipe`, else the recipe named by the string (``"aetv1"``,
    ``"AETV2"``; `RECIPES`). Anything else is refused with the fix."""
    if isinstance(value, Recipe):
        return value
    if isinstance(value, str) and value.lower() in RECIPES:
        return RECIPES[value.lower()]
    raise TypeError(f"expected a Recipe, e.g. aetv2_tf.AETV2, or one of the names "
                    f"{sorted(RECIPES)}; got {value!r}")
