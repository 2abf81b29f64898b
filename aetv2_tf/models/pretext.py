"""The pretext models on uint8 images, for any Keras backend: the pairs (AET) and the rotations
(RotNet, `build_rotations_model`) are made on the device.

    images (B, H, W, 3) uint8
      -> HomographyPairs (data.preprocessing_layers; seeded) -> x, tx (B, H, W, 3) float32, p (B, 8)
      -> build_aet_model(encoder)([x, tx])                   -> p_hat (B, 8) float32
      -> concat([p_hat, p], axis=-1)                         -> output (B, 16) float32

The output carries the decoded AND the true parameters, so a training batch is just the images:
`PairsModel.compute_loss` / `compute_metrics` hand `y_true = output[:, 8:]` and
`y_pred = output[:, :8]` to the compiled loss and metrics. Sampling, augmentation and warp run
inside the compiled step from the layer's seed generator, saved with the weights. Layers:
"pairs", "aet" (the Siamese model), "pred_and_true". RotNet has the same form: `QuarterTurns`
("turns") -> `build_rotation_classifier` -> `concat([logits (4), k])` (4B, 5), `split=4`.

A loss that reads the training step (`GeodesicLoss(mse_decay_steps=n)`) reads
`PairsModel.loss_step` (`count_steps=True`): an int32 model variable incremented in
`compute_loss`, carried through JAX's stateless step (unlike `optimizer.iterations`) and saved
with the weights.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Protocol

import keras

from aetv2_tf.data import warping
from aetv2_tf.data.constants import AETV1_FILL, CIFAR10_MEAN, CIFAR10_STD
from aetv2_tf.data.preprocessing_layers import HomographyPairs, QuarterTurns
from aetv2_tf.errors import SettingWarning
from aetv2_tf.method.recipe_parts import LossSpec, OptimizerSpec
from aetv2_tf.models.aet import build_aet_model, build_rotation_classifier
from aetv2_tf.models.backbones import input_side
from aetv2_tf.models.batch_groups import batch_statistics_groups
from aetv2_tf.models.checked_inputs import ChecksInputs
from aetv2_tf.models.displayed_loss import ShowsDataLoss

NUM_PARAMS = 8


class PretextRecipe(Protocol):
    """What a `PairsModel` compiles itself from (`recipes.Recipe`)."""

    loss: LossSpec
    optimizer: OptimizerSpec

    def build_loss(self, image_size: int, param_std: Sequence[float] | None = None,
                   step: Any = None, shift: str = "integer") -> keras.losses.Loss: ...

    def build_optimizer(self, steps: int, mixed_float16: bool | None = None, *,
                        _stacklevel: int = 2) -> tuple[Any, keras.optimizers.Optimizer]: ...


@keras.saving.register_keras_serializable(package="aetv2_tf")
class PairsModel(ChecksInputs, ShowsDataLoss, keras.Model):
    """The pretext model: a functional model that carries what it was built with and compiles
    itself from its recipe.

    ``split=k``: the output is ``concat([y_pred, y_true])``, fitted on uint8 images alone
    (checked: `models.checked_inputs.ChecksInputs`); ``split=None``: the output is ``y_pred``,
    the targets come as ``y``. ``pretext``: the AET facts of the build (``inputs``,
    ``image_size``, ``shift``, ``param_scale``, ``target``; None for RotNet); ``recipe``: what
    ``compile`` defaults to; ``count_steps``: add `loss_step`; ``batch_groups``: 2 runs the
    forward pass inside `batch_statistics_groups(2)` (`models.aet`). ``schedule``: the last
    compiled learning-rate schedule."""

    def __init__(self, *args, count_steps: bool = False, split: int | None = NUM_PARAMS,
                 pretext: dict | None = None, recipe: PretextRecipe | dict | None = None,
                 batch_groups: int = 1,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.batch_groups = int(batch_groups)
        self.split = split  # output[..., :split] is y_pred, output[..., split:] y_true
        self.labels = "none" if split is not None else "any"  # (`ChecksInputs`)
        self.pretext = dict(pretext) if pretext is not None else None
        if isinstance(recipe, dict):  # a reloaded model's (`recipes.Recipe` is registered)
            recipe = keras.saving.deserialize_keras_object(recipe)
        self.recipe = recipe
        self.schedule = None
        self.loss_step = None
        if count_steps:
            self.loss_step = self.add_weight(shape=(), dtype="int32", initializer="zeros",
                                             trainable=False, name="loss_step")

    def get_config(self) -> dict:  # a `.keras` reload keeps what the model was built with
        recipe = keras.saving.serialize_keras_object(self.recipe) \
            if self.recipe is not None else None
        return {**super().get_config(), "count_steps": self.loss_step is not None,
                "split": self.split, "pretext": self.pretext, "recipe": recipe,
                "batch_groups": self.batch_groups}

    def call(self, inputs, training=None, mask=None, **kwargs):
        if self.batch_groups == 1:
            return super().call(inputs, training=training, mask=mask, **kwargs)
        with batch_statistics_groups(self.batch_groups):
            return super().call(inputs, training=training, mask=mask, **kwargs)

    def compile(self, optimizer: Any = "auto", loss: Any = "auto", metrics: Any = "auto", *,
                steps: int | None = None, recipe: PretextRecipe | None = None,
                **kwargs: Any) -> None:
        """``keras.Model.compile``, where ``"auto"`` is the recipe's (``recipe``, else the
        model's): its loss for this model, its optimizer over ``steps`` optimizer steps
        (required for ``optimizer="auto"``) and `metrics.pretext_metrics` of the loss
        compiled. Without a recipe no metrics, and the loss and optimizer must be given."""
        recipe = recipe or self.recipe
        if _is_auto(metrics) and (recipe is None or self.pretext is None):
            metrics = None  # no recipe: no metrics unless given, as Keras
        auto = [name for name, value in (("optimizer", optimizer), ("loss", loss),
                                         ("metrics", metrics)) if _is_auto(value)]
        if auto and (recipe is None or self.pretext is None):
            raise ValueError(f"{self.name}: {', '.join(auto)}='auto' is the recipe's, and this "
                             "model has none: build it with recipe.build_model(encoder), or "
                             "pass recipe=aetv2_tf.AETV2 (an AET model), or give the "
                             f"{', '.join(auto)} yourself")
        if "optimizer" in auto:
            if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
                raise ValueError(f"steps must be the run's number of optimizer steps, a positive "
                                 f"int (training_steps(examples, batch_size, epochs)); got "
                                 f"{steps!r}")
            if recipe.loss.decoder_scaled and self.pretext["param_scale"] is None:
                rate = recipe.optimizer.learning_rate
                warnings.warn(SettingWarning(
                    "this recipe's MSE is meant for a decoder that regresses std-normalised "
                    "parameters and the model has none (decoder_scale=False): SGD at its "
                    f"learning_rate={rate:g} diverges; build the model with "
                    "recipe.build_model(encoder), whose decoder_scale follows the loss",
                    ("decoder_scale", "learning_rate")),
                    stacklevel=3)
            self.schedule, optimizer = recipe.build_optimizer(steps, _stacklevel=4)
        if "loss" in auto:
            loss = recipe.build_loss(self.pretext["image_size"], self.pretext["param_scale"],
                                     self.loss_step, self.pretext["shift"])
        if "metrics" in auto:  # the frame of the loss compiled
            from aetv2_tf.method.metrics import pretext_metrics

            metrics = pretext_metrics(loss)
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)

    def compile_from_config(self, config: dict) -> None:
        """``compile`` with a reloaded ``.keras`` file's loss, optimizer and metrics."""
        config = keras.saving.deserialize_keras_object(config)
        self.compile(**config)
        if self.built:
            self.optimizer.build(self.trainable_variables)

    def _check_inputs(self, method: str, x: Any, y: Any = None, *,
                      predicting: bool = False) -> None:
        if self.split is not None:  # a split=None model takes what the tf.data pipelines make
            super()._check_inputs(method, x, y, predicting=predicting)

    def _split(self, y, y_pred):
        if self.split is None:
            return y, y_pred
        return y_pred[..., self.split:], y_pred[..., :self.split]

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        y_true, y_hat = self._split(y, y_pred)
        loss = super().compute_loss(x, y_true, y_hat, sample_weight, training=training)
        if training and self.loss_step is not None:  # after the loss: it reads steps 0, 1, ...
            self.loss_step.assign(self.loss_step + 1)
        return loss

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        y_true, y_hat = self._split(y, y_pred)
        return super().compute_metrics(x, y_true, y_hat, sample_weight)


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value == "auto"


@keras.saving.register_keras_serializable(package="aetv2_tf")
class WarpPairs(keras.layers.Layer):
    """The warp of a pair on the device, its homography drawn on the host:
    ``[images (B, H, W, 3) uint8, T (B, 3, 3) float32] -> [x, tx]`` (B, H, W, 3) float32, both
    normalised ``(v / 255 - mean) / std``, ``tx = warp(x, T)`` (model frame, conventions.md).

    ``fused``: TensorFlow's fused op (`homographies.warp`, no XLA kernel) or
    `data.warping.warp` (``keras.ops``, needed under XLA); None: fused under TensorFlow."""

    def __init__(self, fill_value: float = AETV1_FILL, mean: Sequence[float] = CIFAR10_MEAN,
                 std: Sequence[float] = CIFAR10_STD, fused: bool | None = None, **kwargs):
        # float32 whatever the policy: T in bfloat16 puts corners a pixel off at 224.
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.fused = fused
        self.fill_value = float(fill_value)
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        # The fused op has no XLA kernel: Keras's jit_compile="auto" must then not use XLA.
        self.supports_jit = not self._fused()

    def _fused(self) -> bool:
        return keras.backend.backend() == "tensorflow" if self.fused is None else self.fused

    def call(self, inputs):
        images, t = inputs
        x = keras.ops.cast(images, "float32") / 255.0
        if self._fused():
            from aetv2_tf.data.homographies import warp

            tx = warp(x, t, fill_value=self.fill_value)
        else:
            tx = warping.warp(x, t, fill_value=self.fill_value)
        mean = keras.ops.convert_to_tensor(self.mean, "float32")
        std = keras.ops.convert_to_tensor(self.std, "float32")
        return [(x - mean) / std, (tx - mean) / std]

    def compute_output_spec(self, inputs):
        shape = tuple(inputs[0].shape)
        return [keras.KerasTensor(shape, "float32"), keras.KerasTensor(shape, "float32")]

    def get_config(self) -> dict:
        return {**super().get_config(), "fill_value": self.fill_value, "mean": list(self.mean),
                "std": list(self.std), "fused": self.fused}


def build_pairs_model(encoder: keras.Model, seed: int, *, inputs: str = "images",
                      shift: str = "integer", augment: bool = True,
                      mean: Sequence[float] = CIFAR10_MEAN, std: Sequence[float] = CIFAR10_STD,
                      param_scale: Sequence[float] | None = None, init_rotation_deg: float = 0.0,
                      count_steps: bool = False, siamese_batch_norm: str = "per_branch",
                      target: str = "model", feature: str | int | None = None,
                      fused_warp: bool | None = None, recipe: PretextRecipe | None = None,
                      one_pass: bool | None = None) -> PairsModel:
    """The AET pretext model of ``encoder`` (module docstring), a `PairsModel`.

    ``inputs``: "images" (uint8 ``(B, H, W, 3)`` -> ``(B, 16)`` = ``[T_hat params, T params]``,
    pairs made by `HomographyPairs` from ``seed``, ``shift``, ``augment``, ``mean``, ``std``),
    "warp" (``[uint8 images, T (B, 3, 3)]`` -> ``T_hat`` params: `WarpPairs`, ``fused_warp``)
    or "pairs" (``[x, t(x)]`` normalised -> ``T_hat`` params); with "warp" and "pairs" the
    targets come as ``y``. The other arguments: as `build_aet_model`, ``count_steps`` and
    ``recipe`` as `PairsModel`.
    """
    if inputs not in ("images", "warp", "pairs"):
        raise ValueError(f"inputs must be 'images', 'warp' or 'pairs'; got {inputs!r}")
    pretext = dict(inputs=inputs, image_size=input_side(encoder), shift=shift, target=target,
                   param_scale=None if param_scale is None else [float(v) for v in param_scale])
    common = dict(pretext=pretext, recipe=recipe, count_steps=count_steps)
    aet_options = dict(param_scale=param_scale, init_rotation_deg=init_rotation_deg,
                       siamese_batch_norm=siamese_batch_norm, target=target, one_pass=one_pass,
                       _grouping_outside=True)  # the PairsModel sets the groups
    if inputs != "images":
        pairs = WarpPairs(mean=mean, std=std, fused=fused_warp, name="pairs") \
            if inputs == "warp" else None
        aet = build_aet_model(encoder, feature, pairs=pairs, **aet_options)
        return PairsModel(aet.inputs, aet.outputs[0], name="aet", split=None,
                          batch_groups=aet.batch_groups, **common)
    images = keras.Input(shape=tuple(encoder.inputs[0].shape[1:]), dtype="uint8",
                         name="images")
    x, tx, params = HomographyPairs(seed=seed, shift=shift, augment=augment, mean=mean, std=std,
                                    name="pairs")(images)
    aet = build_aet_model(encoder, feature, **aet_options)
    output = keras.layers.Concatenate(axis=-1, dtype="float32", name="pred_and_true")(
        [aet([x, tx]), params])
    return PairsModel(images, output, name="aet_pairs", batch_groups=aet.batch_groups, **common)


def build_rotations_model(encoder: keras.Model, seed: int, *, augment: bool = True,
                          mean: Sequence[float] = CIFAR10_MEAN, std: Sequence[float] = CIFAR10_STD,
                          feature: str | int | None = None) -> PairsModel:
    """RotNet on uint8 images `(B, H, W, 3)` -> `(4B, 5)` = `[logits (4), k]`: `QuarterTurns`
    (seeded augmentation, the 4 rotations) then `build_rotation_classifier(encoder, feature)`
    (`feature`: as `build_aet_model`); the compiled loss and metrics see `(k, logits)`
    (`PairsModel` with `split=4`)."""
    images = keras.Input(shape=tuple(encoder.inputs[0].shape[1:]), dtype="uint8", name="images")
    x, turns = QuarterTurns(seed=seed, augment=augment, mean=mean, std=std, name="turns")(images)
    logits = build_rotation_classifier(encoder, feature)(x)
    output = keras.layers.Concatenate(axis=-1, dtype="float32", name="pred_and_true")(
        [logits, keras.ops.expand_dims(turns, -1)])
    return PairsModel(images, output, name="rotnet_turns", split=4)
