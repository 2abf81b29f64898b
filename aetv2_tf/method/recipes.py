"""Pretraining recipes as values: a recipe is its loss (`LossSpec`) and its optimizer with the
schedule and weight decay (`OptimizerSpec`), two small frozen values that build the Keras
objects; the recipe builds the pretext model, which compiles itself from it.

    recipe = aetv2_tf.AETV2                                 # LossSpec + OptimizerSpec
    model = recipe.build_model(encoder, seed=0)             # uint8 images in, pairs made inside
    model.compile(steps=training_steps(len(images), 64))    # the recipe's loss, optimizer, metrics
    model.fit(images, batch_size=64, epochs=1)
    fast = recipe.replace(learning_rate=1e-3, warmup_steps=15)   # or dataclasses.replace

The pretext model (`models.pretext.PairsModel`) carries what it was built with (image side,
sampler shift, decoder scale, recipe), so loss frame, parameter std and model cannot disagree.
``recipe.compile(model, steps)`` is ``model.compile(steps=..., recipe=recipe)``; the parts stay
public (``build_loss``, ``build_optimizer``, ``metrics``). The recipes below are those of
docs/reproduction.md, each named after its config.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import keras

from aetv2_tf.method.recipe_parts import LossSpec, OptimizerSpec, square_side  # noqa: F401 - square_side: API

_DEFAULT_LOSS, _DEFAULT_OPTIMIZER = LossSpec(), OptimizerSpec()
#: The fields of the two parts by name (what `Recipe(...)` and `replace` take), and where each
#: lives: ``(part, field)``.
_FLAT = {**{f.name: ("loss", f.name) for f in dataclasses.fields(LossSpec)},
         **{f.name: ("optimizer", f.name) for f in dataclasses.fields(OptimizerSpec)}}
_FLAT.update(loss=("loss", "kind"), optimizer=("optimizer", "name"))
del _FLAT["kind"], _FLAT["name"]


@keras.saving.register_keras_serializable(package="aetv2_tf")
@dataclasses.dataclass(frozen=True, init=False)
class Recipe:
    """A pretraining recipe: its `loss` (`LossSpec`) and its `optimizer` (`OptimizerSpec`).

    The parts' fields may also be given by name (``Recipe(loss="mse", learning_rate=0.1)``: a
    string ``loss`` / ``optimizer`` is the loss kind / optimizer name), as `replace` does."""

    loss: LossSpec
    optimizer: OptimizerSpec

    def __init__(self, loss: LossSpec | str = _DEFAULT_LOSS,
                 optimizer: OptimizerSpec | str = _DEFAULT_OPTIMIZER, **fields: Any):
        parts = {"loss": {}, "optimizer": {}}
        for name, value in (("loss", loss), ("optimizer", optimizer)):
            if isinstance(value, str):
                fields[name] = value
            elif isinstance(value, (LossSpec, OptimizerSpec)):
                parts[name] = dataclasses.asdict(value)
            else:
                kind = "LossSpec" if name == "loss" else "OptimizerSpec"
                raise TypeError(f"Recipe {name}: a {kind} or a string; got {value!r}")
        for name, value in fields.items():
            if name not in _FLAT:
                raise TypeError(f"Recipe has no field {name!r}; the fields of its loss and "
                                f"optimizer: {sorted(_FLAT)}")
            part, field = _FLAT[name]
            parts[part][field] = value
        object.__setattr__(self, "loss", LossSpec(**parts["loss"]))
        object.__setattr__(self, "optimizer", OptimizerSpec(**parts["optimizer"]))

    def replace(self, **changes: Any) -> Recipe:
        """A recipe with these fields of its loss or optimizer changed (by their names)."""
        return Recipe(self.loss, self.optimizer, **changes)

    def get_config(self) -> dict:
        """The two parts as dicts (a pretext model saves its recipe with it)."""
        return {"loss": dataclasses.asdict(self.loss),
                "optimizer": dataclasses.asdict(self.optimizer)}

    @classmethod
    def from_config(cls, config: dict) -> Recipe:
        return cls(LossSpec(**config["loss"]), OptimizerSpec(**config["optimizer"]))

    def build_loss(self, image_size: int | Sequence[int], param_std: Sequence[float] | None = None,
                   step: Any = None, shift: str = "integer") -> keras.losses.Loss:
        """`LossSpec.build` of this recipe's loss."""
        return self.loss.build(image_size, param_std, step, shift)

    def build_optimizer(self, steps: int, mixed_float16: bool | None = None, *,
                        _stacklevel: int = 2) -> tuple[Any, keras.optimizers.Optimizer]:
        """`OptimizerSpec.build` of this recipe's optimizer: ``(schedule, optimizer)``."""
        return self.optimizer.build(steps, mixed_float16, _stacklevel=_stacklevel + 1)

    def metrics(self, image_size: int | Sequence[int] = 32,
                param_std: Sequence[float] | None = None, step: Any = None,
                shift: str = "integer") -> list[keras.metrics.Metric]:
        """`metrics.pretext_metrics` of `build_loss` with these arguments."""
        from aetv2_tf.method.metrics import pretext_metrics

        return pretext_metrics(self.build_loss(image_size, param_std, step, shift))

    def decoder_options(self, image_size: int, shift: str = "integer",
                        decoder_scale: bool | None = None,
                        param_std: Sequence[float] | None = None) -> dict[str, Any]:
        """`LossSpec.decoder_options` of this recipe's loss."""
        return self.loss.decoder_options(image_size, shift, decoder_scale, param_std)

    def build_model(self, encoder: keras.Model, seed: int = 0, *, inputs: str = "images",
                    shift: str = "integer", decoder_scale: bool | None = None,
                    param_std: Sequence[float] | None = None, **kwargs: Any) -> keras.Model:
        """THE pretext model of this recipe (`models.pretext.build_pairs_model`), carrying the
        recipe, so that ``model.compile(steps=...)`` needs nothing else. ``inputs``: as
        `build_pairs_model`; ``decoder_scale`` (True / False overrides the loss's default) with
        ``param_std`` (None: `parameter_std`); other keyword arguments pass through."""
        from aetv2_tf.models.pretext import build_pairs_model

        for name in ("param_scale", "target"):
            if name in kwargs:
                raise TypeError(f"build_model: the recipe decides {name} (decoder_scale=True / "
                                "False overrides the scale); call build_pairs_model to set it")
        from aetv2_tf.models.backbones import input_side

        options = self.decoder_options(input_side(encoder), shift, decoder_scale, param_std)
        count_steps = bool(kwargs.pop("count_steps", False)) or self.loss.counts_steps
        return build_pairs_model(encoder, seed, inputs=inputs, shift=shift, recipe=self,
                                 count_steps=count_steps, **options, **kwargs)

    def compile(self, model: keras.Model, steps: int, **compile_kwargs: Any):
        """``model.compile`` of an AET pretext model with this recipe for ``steps`` optimizer
        steps (`training_steps`); returns the learning-rate schedule. Other keyword arguments
        go to ``model.compile``."""
        from aetv2_tf.models.pretext import PairsModel

        if not isinstance(model, PairsModel) or model.pretext is None:
            from aetv2_tf.errors import UsageError

            raise UsageError(
                f"Recipe.compile: model {getattr(model, 'name', model)!r} is not an AET pretext "
                "model: build one with recipe.build_model(encoder) or aetv2_tf.build_pairs_model("
                "encoder, seed=0). A RotNet model (build_rotations_model) is not an AET "
                "recipe's: compile it yourself with a cross-entropy (keras.losses."
                "SparseCategoricalCrossentropy(from_logits=True))")
        model.compile(steps=steps, recipe=self, **compile_kwargs)
        return model.schedule


def training_steps(examples: int, batch_size: int, epochs: int = 1) -> int:
    """The optimizer steps of ``model.fit`` on ``examples`` images:
    ``epochs * ceil(examples / batch_size)``."""
    if examples <= 0 or batch_size <= 0 or epochs <= 0:
        raise ValueError(f"examples, batch_size and epochs must be positive; got {examples}, "
                         f"{batch_size}, {epochs}")
    return int(epochs) * math.ceil(examples / batch_size)


#: The paper's literal AETv2 (configs/cifar10_aetv2_paper.cfg): Eq. 11 with lambda = 1.
AETV2_PAPER = Recipe(LossSpec("geodesic", projection_weight=1.0),
                     OptimizerSpec("adam", learning_rate=1e-5, lr_schedule="constant"))
#: AETv1 (configs/cifar10_aetv1.cfg): the std-normalised MSE, SGD Nesterov, AETv1's schedule.
AETV1 = Recipe(LossSpec("mse", mse_normalize=True),
               OptimizerSpec("sgd", learning_rate=0.1, lr_schedule="aetv1", momentum=0.9))
#: The paper's AETv1 as its published code trains it (configs/cifar10_aetv1_official.cfg): the
#: MSE on its own targets (PIL's inverse map, fixed normalisation), otherwise as `AETV1`.
AETV1_OFFICIAL = AETV1.replace(mse_target="official")

#: theta in the 16x zoomed frame, no residual (configs/cifar10_aetv2_zoom16.cfg; the presets
#: ``aetv2_cifar10``'s); the optimizer of every AETv2 below.
AETV2_ZOOM16 = Recipe(LossSpec("geodesic", projection_weight=0.0, frame_scale=16.0),
                      OptimizerSpec("adam", learning_rate=1e-4, lr_schedule="cosine",
                                    warmup_steps=1000))
#: theta^2 (Eq. 5) at 4x, no residual (configs/cifar10_aetv2_sq4.cfg).
AETV2_SQ4 = AETV2_ZOOM16.replace(angle_power=2, frame_scale=4.0)
#: The AETv2 recipe (configs/cifar10_aetv2.cfg): theta^2 at 4x + 10 ||M - P||_F^2 of M in the
#: UNIT frame, so that scale, shear and keystone errors weigh at their own size.
AETV2 = AETV2_SQ4.replace(projection_weight=10.0, residual_frame="unit")
#: `AETV2` under the name of configs/cifar10_aetv2_sq4_unitres.cfg.
AETV2_SQ4_UNITRES = AETV2
#: theta^2 at 4x + 0.3 x AETv1's normalised MSE (configs/cifar10_aetv2_hybrid.cfg).
AETV2_HYBRID = AETV2_SQ4.replace(mse_weight=0.3)

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
