"""The recipe decides everything it affects: `Recipe.build_model` builds the decoder the
command line builds (AETv1's parameter scale, the official targets, the step counter) into a
pretext model that carries what it was built with, which compiles itself from the recipe; a
warm-up longer than half the run warns, and image sizes are validated."""

from __future__ import annotations

import dataclasses
import pathlib
import warnings

import keras
import numpy as np
import pytest

import aetv2_tf
from aetv2_tf.data.sampler import parameter_std
from aetv2_tf.method import recipes
from aetv2_tf.method.recipes import AETV1, AETV1_OFFICIAL, AETV2, training_steps


def _layers(model: keras.Model) -> list[keras.layers.Layer]:
    found = []
    for layer in model.layers:
        found.append(layer)
        if isinstance(layer, keras.Model):
            found.extend(_layers(layer))
    return found


def _layer(model: keras.Model, name: str):
    return next((layer for layer in _layers(model) if layer.name == name), None)


def _fit_loss(model: keras.Model, images: np.ndarray) -> float:
    return float(model.fit(images, batch_size=32, epochs=1, verbose=0).history["loss"][-1])


@pytest.mark.slow
def test_aetv1_through_the_recipe_trains_where_the_unscaled_decoder_diverges(cifar10_dir):
    images = aetv2_tf.load_cifar10(str(cifar10_dir), "train")[0][:128]
    steps = training_steps(len(images), batch_size=32)
    assert steps == 4
    # A pretext model without the decoder scale: SGD at 0.1 diverges (2e20 measured).
    keras.utils.set_random_seed(0)
    unscaled = aetv2_tf.build_pairs_model(aetv2_tf.build_backbone("nin"), seed=0)
    _, optimizer = AETV1.build_optimizer(steps=steps)
    unscaled.compile(optimizer=optimizer, loss=AETV1.build_loss(32), metrics=AETV1.metrics())
    unscaled_loss = _fit_loss(unscaled, images)
    assert not np.isfinite(unscaled_loss) or unscaled_loss > 1e6, unscaled_loss
    # The recipe's path: the decoder scale the command line uses (keras_native_backend:
    # parameter_std(size, --shift)), the loss dividing by the same numbers.
    keras.utils.set_random_seed(0)
    model = AETV1.build_model(aetv2_tf.build_backbone("nin"), seed=0)
    scale = np.asarray(_layer(model, "decoder_scale").scale, np.float32)
    np.testing.assert_allclose(scale, parameter_std(32, "integer"), rtol=1e-6)
    schedule = AETV1.compile(model, steps)
    assert schedule is model.schedule
    assert schedule.total_steps == steps and model.optimizer is not None
    np.testing.assert_allclose(model.loss.get_config()["std"], scale, rtol=1e-6)
    new_loss = _fit_loss(model, images)
    assert np.isfinite(new_loss) and new_loss < 100.0, new_loss


def test_compile_warns_for_an_aetv1_model_without_the_decoder_scale():
    model = aetv2_tf.build_pairs_model(aetv2_tf.build_backbone("nin"), seed=0)
    with pytest.warns(UserWarning, match=r"recipe\.build_model"):
        AETV1.compile(model, steps=10)


def test_a_warmup_longer_than_half_the_run_warns_with_the_peak_it_reaches():
    with pytest.warns(UserWarning, match=r"peaks at 2\.7\de-07.*shorten the warm-up \(to 0, "
                                         r"say\)") as record:
        schedule, _ = AETV2.build_optimizer(steps=8)
    assert record[0].filename == __file__  # attributed to the caller
    assert schedule.warmup_steps == 1000  # warned, not changed
    with pytest.warns(UserWarning, match=r"peaks at 1\.03e-05"):
        AETV2.build_optimizer(steps=390)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AETV2.build_optimizer(steps=2000)
        AETV1.build_optimizer(steps=8)  # no warm-up
        dataclasses.replace(AETV2, warmup_steps=0).build_optimizer(steps=8)


def test_the_model_carries_its_image_size_and_compiles_from_its_recipe():
    encoder = aetv2_tf.build_backbone("nin", input_shape=(64, 64, 3))
    model = AETV2.build_model(encoder, seed=0)
    assert model.loss_step is None and _layer(model, "decoder_scale") is None
    assert model.pretext["image_size"] == 64 and model.recipe == AETV2
    model.compile(steps=4000)  # the recipe's, for this model
    assert model.loss.get_config() == AETV2.build_loss(64).get_config()
    assert model.schedule.total_steps == 4000
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AETV2.compile(model, steps=4000)
    assert model.loss.get_config() == AETV2.build_loss(64).get_config()
    pixel = dataclasses.replace(AETV2, frame="pixel")  # a frame that depends on the size
    pixel.compile(model, steps=4000)
    assert model.loss.get_config() == pixel.build_loss(64).get_config()
    assert model.loss.get_config() != pixel.build_loss(32).get_config()
    for shape in ((32, 64, 3), (None, None, 3)):
        with pytest.raises(ValueError, match="square images of a known size"):
            AETV2.build_model(aetv2_tf.build_backbone("nin", input_shape=shape))
    plain = aetv2_tf.build_pairs_model(encoder, seed=0)  # built without a recipe
    with pytest.raises(ValueError, match="optimizer, loss='auto' is the recipe's"):
        plain.compile(steps=10)
    AETV2.compile(plain, steps=4000)
    assert plain.loss.get_config() == AETV2.build_loss(64).get_config()


def test_compile_refuses_a_model_without_the_pairs():
    """RotNet's model (or any other) has no homography pairs: the AET loss would be compiled
    on its logits; refused, naming the builders of an AET model."""
    encoder = aetv2_tf.build_backbone("nin", (16, 16, 3))
    rotations = aetv2_tf.build_rotations_model(encoder, seed=0)
    with pytest.raises(ValueError, match=r"not an AET pretext model.*recipe\.build_model\("
                                         r"encoder\).*build_pairs_model.*RotNet"):
        AETV2.compile(rotations, steps=10)
    assert not rotations.compiled
    warm = dataclasses.replace(AETV2, warmup_steps=0)  # 10 steps: no warm-up warning
    warm.compile(aetv2_tf.build_pairs_model(encoder, seed=0), steps=10)  # the pairs: taken


def test_build_model_decides_the_target_and_the_step_counter():
    encoder = aetv2_tf.build_backbone("nin")
    official = AETV1_OFFICIAL.build_model(encoder, seed=0)
    assert _layer(official, "from_aetv1_targets") is not None
    assert _layer(official, "decoder_scale") is None
    warm_up = dataclasses.replace(AETV2, mse_weight=1.0, mse_decay_steps=10)
    model = warm_up.build_model(encoder, seed=0)
    assert model.loss_step is not None
    warm_up.compile(model, steps=4000)
    assert model.loss.step is model.loss_step
    with pytest.raises(TypeError, match="the recipe decides param_scale"):
        AETV1.build_model(encoder, param_scale=np.ones(8))
    with pytest.raises(ValueError, match="no decoder_scale"):
        AETV1_OFFICIAL.build_model(encoder, decoder_scale=True)
    with pytest.raises(ValueError, match="positive int"):
        AETV2.compile(model, steps=0)


def test_pairs_models_reload_with_their_split_and_step_counter(tmp_path):
    """`PairsModel`'s config carries `split` (RotNet: 4) and `count_steps` (an MSE warm-up's
    `loss_step`, saved with the weights): both reload from `.keras`."""
    encoder = aetv2_tf.build_backbone("nin", (16, 16, 3))
    warm_up = dataclasses.replace(AETV2, mse_weight=1.0, mse_decay_steps=10)
    model = warm_up.build_model(encoder, seed=0)
    model.loss_step.assign(7)
    model.save(tmp_path / "pairs.keras")
    again = keras.saving.load_model(tmp_path / "pairs.keras", compile=False)
    assert int(again.loss_step.numpy()) == 7 and again.split == 8
    rotations = aetv2_tf.build_rotations_model(encoder, seed=0)
    rotations.save(tmp_path / "rotations.keras")
    again = keras.saving.load_model(tmp_path / "rotations.keras", compile=False)
    assert again.split == 4 and again.loss_step is None


def test_build_loss_takes_square_image_sizes_only():
    assert AETV2.build_loss((64, 64)).get_config() == AETV2.build_loss(64).get_config()
    np.testing.assert_allclose(AETV1.build_loss(np.int64(64)).get_config()["std"],
                               parameter_std(64), rtol=1e-6)
    for bad in ((32, 64), (32, 32, 3), 0, -32, 32.0, True, "32", None):
        with pytest.raises(ValueError, match="square images"):
            AETV2.build_loss(bad)


def test_recipes_by_name_and_run_lengths():
    assert recipes.as_recipe("aetv1") is AETV1 and recipes.as_recipe("AETV2") is AETV2
    assert recipes.as_recipe(AETV1_OFFICIAL) is AETV1_OFFICIAL
    for bad in (3, "aetv3", None):
        with pytest.raises(TypeError, match="expected a Recipe"):
            recipes.as_recipe(bad)
    assert training_steps(512, 64) == 8 and training_steps(50_000, 128, epochs=3) == 1173
    with pytest.raises(ValueError):
        training_steps(0, 64)


def test_one_decoder_rule_for_the_recipe_and_both_backends():
    """`Recipe.decoder_options` is the decoder's one rule: `build_model` builds through it, and
    both program backends (keras_native_backend, tensorflow_backend) build through `build_model`
    (`program.pretext_stage.build_model`), none restates it."""
    std = parameter_std(32, "integer")
    options = AETV1.decoder_options(32)
    np.testing.assert_allclose(options["param_scale"], std, rtol=1e-6)
    assert options["target"] == "model"
    assert AETV2.decoder_options(32) == {"param_scale": None, "target": "model"}
    assert AETV1_OFFICIAL.decoder_options(32) == {"param_scale": None, "target": "official"}
    assert AETV1.decoder_options(32, decoder_scale=False)["param_scale"] is None
    given = np.arange(1, 9, dtype=np.float32)  # a backend's own sampler's numbers are used
    assert AETV2.decoder_options(32, decoder_scale=True, param_std=given)["param_scale"] is given
    with pytest.raises(ValueError, match="no decoder_scale"):
        AETV1_OFFICIAL.decoder_options(32, decoder_scale=True)
    program = pathlib.Path(aetv2_tf.__file__).parent / "program"
    for backend in ("keras_native_backend.py", "tensorflow_backend.py"):
        text = (program / backend).read_text()
        assert "pretext_stage.build_model(" in text, backend
        assert "decoder_options(" not in text and "param_scale=" not in text, backend
        assert "mse_target" not in text and ".compile(" not in text, backend
    assert "recipe.build_model(" in (program / "pretext_stage.py").read_text()
