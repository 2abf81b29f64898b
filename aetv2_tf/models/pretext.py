"""The pretext models on uint8 images, for any Keras backend: the pairs (AET) and the rotations
(RotNet, `build_rotations_model`) are made on the device.

    images (B, H, W, 3) uint8
      -> HomographyPairs (data.preprocessing_layers; seeded) -> x, tx (B, H, W, 3) float32, p (B, 8)
      -> build_aet_model(encoder)([x, tx])                   -> p_hat (B, 8) float32
      -> concat([p_hat, p], axis=-1)                         -> output (B, 16) float32

The model's output carries the decoded AND the true parameters, so a training batch is just the
images (no `y`): `PairsModel.compute_loss` / `compute_metrics` split the output into
`y_pred = output[:, :8]` and `y_true = output[:, 8:]` and hand them to the compiled loss and
metrics, which are the usual `GeodesicLoss` / `ParameterMSELoss` / `pretext_metrics` on (B, 8).
The warp, the sampling and the augmentation run inside the compiled train step (`jax.jit` under
JAX), from the layer's `keras.random.SeedGenerator`, whose state is a non-trainable variable
saved with the weights (`HomographyPairs.save_own_variables`).

Layer names: "pairs" (HomographyPairs), "aet" (the Siamese model, whose encoder is the layer
"nin"/"alexnet"), "pred_and_true" (the concatenation).

RotNet (`build_rotations_model`) has the same form: images -> `QuarterTurns` ("turns": the B
images in their 4 rotations, labels k) -> `build_rotation_classifier(encoder)` ->
`concat([logits (4), k])` (4B, 5); `PairsModel(split=4)` hands `(k, logits)` to the
cross-entropy and accuracy.

A loss that depends on the training step (`GeodesicLoss(mse_decay_steps=n)`) reads
`PairsModel.loss_step` (`count_steps=True`): a non-trainable int32 counter of the training steps,
incremented in `compute_loss`. Unlike `optimizer.iterations`, a model variable is carried through
Keras's stateless JAX train step, so the loss sees the traced step, not a constant frozen when the
step was compiled; it is saved with the weights, so a resumed run continues the schedule.
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
    """What a `PairsModel` compiles itself from (`recipes.Recipe`): its two parts and the
    values they build, neither of which touches a model."""

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

    With ``split=k`` its output is ``concat([y_pred, y_true])`` and loss and metrics see the two
    halves as ``(y_true, y_pred)`` (module docstring): fitted on images alone (``y=None``);
    ``fit`` / ``evaluate`` / ``predict`` and the ``*_on_batch`` methods check them (uint8
    (N, H, W, 3) of the model's size, no labels: `models.checked_inputs.ChecksInputs`). With
    ``split=None`` its output is ``y_pred`` and the targets come as ``y`` (the tf.data
    pipelines' pairs, ``inputs="warp"`` or ``"pairs"`` of `build_pairs_model`).

    ``pretext``: the AET facts of the build (``inputs``, ``image_size``, ``shift``,
    ``param_scale``, ``target``; None for RotNet), ``recipe``: the `recipes.Recipe` that
    ``compile`` defaults to (None: none), ``count_steps``: the step counter `loss_step`
    (module docstring; else None). ``schedule``: the learning-rate schedule of the last
    ``compile`` that built the optimizer. ``batch_groups``: 2 for the one-pass per-branch
    model (its forward pass runs inside `batch_statistics_groups(2)`: each half of the
    encoder's joint batch has its own BatchNorm statistics, `models.aet`), else 1."""

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
        """``keras.Model.compile``, where ``"auto"`` (the default) is the recipe's (``recipe``,
        else the one the model was built with): its loss for this model's image size, sampler
        and decoder scale (`recipe_parts.LossSpec.build`), its metrics, and the optimizer it
        builds (`recipe_parts.OptimizerSpec.build`: a value, which touches no model) with the
        schedule laid out over ``steps`` optimizer steps (`recipes.training_steps`; required
        for ``optimizer="auto"``). ``metrics="auto"`` describes the loss compiled
        (`metrics.pretext_metrics`: the angle in its frame, the quarter turns); without a recipe
        it is none and the loss and optimizer must be given. The ``loss`` shown is that loss
        alone, beside its terms, the weight decay apart as ``l2_penalty``
        (`displayed_loss.ShowsDataLoss`). Other keyword arguments go to Keras."""
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
        """A reloaded ``.keras`` file's compiled loss, optimizer and metrics (Keras skips this
        for a model whose ``compile`` is its own): ``compile`` with them as saved."""
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

    The tf.data pipeline (`pretext_dataset(warp_on_device=True)`) still crops the images and
    draws ``T`` and the target parameters; only the warp, the one stage whose cost is per output
    pixel, moves into the compiled step. Under TensorFlow it is the pipeline's own op
    (`homographies.warp`, the fused ``ImageProjectiveTransformV3``, with CPU and GPU kernels):
    the same pairs as on the host up to the uint8 rounding of x; under other backends, and with
    ``fused=False``, it is `data.warping.warp` (``keras.ops``, equal to it up to float rounding):
    the fused op has no XLA kernel, so a step compiled by XLA under TensorFlow (a TPU, or
    ``jit_compile=True``) needs ``fused=False``. ``fused=None``: fused under TensorFlow."""

    def __init__(self, fill_value: float = AETV1_FILL, mean: Sequence[float] = CIFAR10_MEAN,
                 std: Sequence[float] = CIFAR10_STD, fused: bool | None = None, **kwargs):
        # float32 whatever the global policy: a mixed policy would autocast T to bfloat16
        # (8 bits of mantissa: corners off by a pixel at 224); the encoder casts x and tx itself.
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


def build_pairs_model(
    encoder: keras.Model,
    seed: int,
    *,
    inputs: str = "images",
    shift: str = "integer",
    augment: bool = True,
    mean: Sequence[float] = CIFAR10_MEAN,
    std: Sequence[float] = CIFAR10_STD,
    param_scale: Sequence[float] | None = None,
    init_rotation_deg: float = 0.0,
    count_steps: bool = False,
    siamese_batch_norm: str = "per_branch",
    target: str = "model",
    feature: str | int | None = None,
    fused_warp: bool | None = None,
    recipe: PretextRecipe | None = None,
    one_pass: bool | None = None,
) -> PairsModel:
    """The AET pretext model of ``encoder`` (module docstring), a `PairsModel`.

    ``inputs``: "images" (uint8 images ``(B, H, W, 3)`` -> ``(B, 16)`` = ``[T_hat params, T
    params]``, the pairs made inside by `HomographyPairs`: ``seed``, ``shift``, ``augment``,
    ``mean``, ``std``), "warp" (``[uint8 images, T (B, 3, 3)]`` -> ``T_hat`` params, only the
    warp inside: `WarpPairs` with ``mean``, ``std`` and ``fused=fused_warp``) or "pairs" (``[x,
    t(x)]`` normalised -> ``T_hat`` params); with "warp" and "pairs" the targets come as ``y``.
    ``encoder``, ``feature``, ``param_scale``, ``init_rotation_deg``, ``siamese_batch_norm``,
    ``target``, ``one_pass``: as `build_aet_model` (``feature=None``: "block4" for NIN, "fc7" for
    AlexNet, the only output of a single-output encoder; `models.features`; ``one_pass=None``:
    per-branch BatchNorm in one encoder call on a GPU, two calls elsewhere). ``count_steps``:
    add the training-step counter `loss_step`. ``recipe``: what ``model.compile()`` defaults to
    (`recipes.Recipe.build_model` passes itself).
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


def build_rotations_model(
    encoder: keras.Model,
    seed: int,
    *,
    augment: bool = True,
    mean: Sequence[float] = CIFAR10_MEAN,
    std: Sequence[float] = CIFAR10_STD,
    feature: str | int | None = None,
) -> PairsModel:
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
