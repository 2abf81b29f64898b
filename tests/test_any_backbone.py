"""Issue 32, asks 3 and 4: your own backbone (a Sequential CNN, keras.applications'
MobileNetV3Small, a single-tensor encoder) through the pretext models, `save_encoder` /
`load_encoder` (on both backends); encoders that carry their preprocessing (`build_classifier`,
`feature_extractor`); the presets of `results/scale/`."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest

import aetv2_tf
from aetv2_tf.data.constants import CIFAR10_MEAN, CIFAR10_STD, IMAGENET_MEAN, IMAGENET_STD
from aetv2_tf.errors import UsageError
from aetv2_tf.files import presets
from aetv2_tf.files.saving import load_encoder, load_encoder_weights, preprocessing, save_encoder
from aetv2_tf.models import build_aet_model, build_backbone
from aetv2_tf.models.image_models import CheckedModel, build_classifier, feature_extractor
from aetv2_tf.models.pretext import PairsModel, build_pairs_model, build_rotations_model
from aetv2_tf.probes.knn import pooled_features
from aetv2_tf.registry import SERIALIZABLE
from tests.cli import REPO, _env

RNG = np.random.default_rng(0)
GRADIENT_WARNING = "Gradients do not exist"


def _uint8_images(n: int, size: int) -> np.ndarray:
    return RNG.integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def _sequential(size: int = 16) -> keras.Model:
    return keras.Sequential([
        keras.Input((size, size, 3)),
        keras.layers.Conv2D(8, 3, padding="same", use_bias=False, name="conv1"),
        keras.layers.BatchNormalization(name="bn1"),
        keras.layers.ReLU(name="block1"),
        keras.layers.Conv2D(16, 3, strides=2, padding="same", name="conv2"),
        keras.layers.ReLU(name="features"),
    ], name="my_cnn")


def _pretrain(encoder: keras.Model, feature, size: int) -> keras.Model:
    """Two steps of the README's AETv2 pretraining on `feature`."""
    model = build_pairs_model(encoder, seed=0, feature=feature)
    recipe = dataclasses.replace(aetv2_tf.AETV2, warmup_steps=0)  # 2 steps: no warm-up
    _, optimizer = recipe.build_optimizer(steps=2)
    model.compile(optimizer=optimizer, loss=recipe.build_loss(image_size=size),
                  metrics=recipe.metrics())
    history = model.fit(_uint8_images(16, size), batch_size=8, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    return model


def _roundtrip(encoder: keras.Model, directory) -> keras.Model:
    save_encoder(encoder, str(directory), recipe="aetv2")
    record = json.loads((directory / "flags.json").read_text())
    assert record["custom_encoder"] is True and record["backbone"] == "custom"
    assert record["loss"] == "geodesic" and record["encoder_name"] == encoder.name
    assert (directory / "encoder.keras").is_file()
    assert not (directory / "encoder.weights.h5").exists()
    again = load_encoder(str(directory))
    assert [w.shape for w in again.weights] == [w.shape for w in encoder.weights]
    return again


def test_a_sequential_cnn_pretrains_saves_loads_and_gives_features(tmp_path):
    encoder = _sequential()
    _pretrain(encoder, "features", 16)
    again = _roundtrip(encoder, tmp_path / "cnn")
    assert json.loads((tmp_path / "cnn" / "flags.json").read_text())["features"] == ["features"]
    images = _uint8_images(6, 16)
    want = pooled_features(encoder, None, images, CIFAR10_MEAN, CIFAR10_STD, batch_size=4)
    got = pooled_features(again, None, images, **preprocessing(tmp_path / "cnn"), batch_size=4)
    assert want.shape == (6, 16 * 4 * 4)  # the 8x8x16 map, 2x2-pooled
    np.testing.assert_allclose(got, want, atol=1e-5)
    # an inner layer is a feature too: the encoder is cut there (RotNet on "block1")
    rotations = build_rotations_model(encoder, seed=0, feature="block1")
    assert rotations.get_layer("rotnet").get_layer("rotation_logits").kernel.shape == (8, 4)


@pytest.mark.slow
def test_mobilenet_v3_small_pretrains_on_an_inner_block_saves_and_loads(tmp_path):
    encoder = keras.applications.MobileNetV3Small(
        input_shape=(32, 32, 3), include_top=False, weights=None, include_preprocessing=False)
    model = _pretrain(encoder, "expanded_conv_2_add", 32)  # (4, 4, 24): GAP -> 24 + 24
    assert model.get_layer("aet").get_layer("decoder").kernel.shape == (48, 8)
    again = _roundtrip(encoder, tmp_path / "mobilenet")
    images = _uint8_images(4, 32)
    whole = [pooled_features(e, None, images, CIFAR10_MEAN, CIFAR10_STD, batch_size=4,
                             pool="global") for e in (encoder, again)]
    assert whole[0].shape == (4, 576)
    np.testing.assert_allclose(whole[1], whole[0], atol=1e-4)
    inner = [feature_extractor(e, "expanded_conv_2_add", pool="global").predict(images,
                                                                                 verbose=0)
             for e in (encoder, again)]
    np.testing.assert_allclose(inner[1], inner[0], atol=1e-4)


def test_the_feature_of_single_list_and_vector_encoders():
    image = keras.Input((8, 8, 3), name="image")
    conv = keras.layers.Conv2D(4, 3, name="conv")(image)
    single = keras.Model(image, conv, name="single")  # iterating it used to fail
    assert build_aet_model(single).get_layer("decoder").kernel.shape == (8, 8)
    assert build_aet_model(single, feature=0).get_layer("decoder").kernel.shape == (8, 8)
    x = np.random.default_rng(1).normal(size=(2, 8, 8, 3)).astype("float32")
    assert build_aet_model(single)([x, x]).shape == (2, 8)
    vector = keras.layers.Dense(5, name="vector")(keras.layers.Flatten()(conv))
    listed = keras.Model(image, [conv, vector], name="listed")
    assert build_aet_model(listed, feature="vector").get_layer("decoder").kernel.shape == (10, 8)
    assert build_aet_model(listed, feature=1).get_layer("decoder").kernel.shape == (10, 8)
    with pytest.raises(ValueError, match=r"no default feature.*'listed'.*\['conv', 'vector'\]"):
        build_aet_model(listed)
    with pytest.raises(ValueError,
                       match=r"unknown feature 'block2': encoder 'listed' outputs \['conv', 'vec"):
        build_aet_model(listed, feature="block2")
    with pytest.raises(ValueError, match="unknown feature 'block_x'.*outputs.*block1"):
        build_pairs_model(build_backbone("nin", (16, 16, 3)), seed=0, feature="block_x")


def test_save_encoder_takes_an_encoder_of_any_size(tmp_path):
    """A variable-size encoder (input (None, None, 3)): its record's image_size is null, it
    reloads and gives the same features; a refused save leaves no directory behind."""
    encoder = keras.applications.MobileNetV3Small(
        input_shape=(None, None, 3), include_top=False, weights=None,
        include_preprocessing=False)
    with pytest.raises(TypeError, match="expected a Recipe"):
        save_encoder(encoder, str(tmp_path / "refused"), recipe=3)
    with pytest.raises(ValueError, match="no symbolic outputs"):
        save_encoder(keras.Sequential([keras.layers.Dense(2)]), str(tmp_path / "unbuilt"))
    assert not (tmp_path / "refused").exists() and not (tmp_path / "unbuilt").exists()
    save_encoder(encoder, str(tmp_path / "any_size"), recipe="aetv2")
    record = json.loads((tmp_path / "any_size" / "flags.json").read_text())
    assert record["image_size"] is None and record["input_shape"] == [None, None, 3]
    again = load_encoder(str(tmp_path / "any_size"))
    assert again.input_shape == (None, None, None, 3)
    images = _uint8_images(2, 32)
    want = pooled_features(encoder, None, images, CIFAR10_MEAN, CIFAR10_STD, pool="global")
    np.testing.assert_allclose(
        pooled_features(again, None, images, CIFAR10_MEAN, CIFAR10_STD, pool="global"), want,
        atol=1e-4)
    nin = build_backbone("nin", (16, 16, 3))
    save_encoder(nin, str(tmp_path / "nin"))
    assert json.loads((tmp_path / "nin" / "flags.json").read_text())["image_size"] == 16


def test_save_encoder_keeps_the_run_layout_for_the_package_backbones(tmp_path):
    nin = build_backbone("nin", (16, 16, 3))
    save_encoder(nin, str(tmp_path / "nin"), recipe="aetv1")
    record = json.loads((tmp_path / "nin" / "flags.json").read_text())
    assert set(record) == {"stage", "pretext", "backbone", "dataset", "batch_norm", "backend",
                           "loss", "saved_by", "image_size"}
    assert (record["backbone"], record["loss"]) == ("nin", "mse")
    assert not (tmp_path / "nin" / "encoder.keras").exists()
    with pytest.raises(TypeError, match="expected a Recipe, e.g. aetv2_tf.AETV2"):
        save_encoder(nin, str(tmp_path / "bad"), recipe=3)
    two_blocks = aetv2_tf.models.build_nin((16, 16, 3), num_blocks=2, batch_norm="keras")
    with pytest.raises(UsageError, match="holds an encoder saved before"):
        save_encoder(two_blocks, str(tmp_path / "nin"), dataset="imagenet")
    save_encoder(two_blocks, str(tmp_path / "nin"), dataset="imagenet",
                 overwrite=True)  # a custom "nin" now
    assert not (tmp_path / "nin" / "encoder.weights.h5").exists()
    saved = json.loads((tmp_path / "nin" / "flags.json").read_text())
    assert saved["features"] == ["block1", "block2"]
    assert load_encoder(str(tmp_path / "nin")).output["block2"].shape == (None, 4, 4, 192)
    assert preprocessing(tmp_path / "nin") == {"mean": IMAGENET_MEAN, "std": IMAGENET_STD}
    with pytest.raises(ValueError, match="custom encoder.*aetv2_tf.load_encoder"):
        load_encoder_weights(str(tmp_path / "nin"), saved, "keras")


def test_a_classifier_fine_tunes_block2_only_and_reloads(tmp_path):
    keras.utils.set_random_seed(0)
    encoder = build_backbone("nin", (16, 16, 3), batch_norm="keras")
    images, labels = _uint8_images(8, 16), np.arange(8) % 10
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def one_step(model):
        model.compile(optimizer="adam", loss=loss)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(images, labels, batch_size=8, epochs=1, verbose=0)
        return " ".join(str(w.message) for w in caught)

    # the control: the whole encoder, block 2 picked from its outputs, does warn
    x = keras.Input((16, 16, 3))
    whole = keras.Model(x, keras.layers.Dense(10)(keras.layers.Flatten()(encoder(x)["block2"])))
    assert GRADIENT_WARNING in one_step(whole)
    classifier = build_classifier(encoder, 10)  # block 2 by default
    assert not any("block3" in v.path or "block4" in v.path for v in classifier.weights)
    assert GRADIENT_WARNING not in one_step(classifier)
    config = classifier.get_layer("preprocessing").get_config()
    assert (tuple(config["mean"]), tuple(config["std"])) == (CIFAR10_MEAN, CIFAR10_STD)
    classifier.save(tmp_path / "classifier.keras")
    reloaded = keras.saving.load_model(tmp_path / "classifier.keras")
    np.testing.assert_allclose(reloaded.predict(images, verbose=0),
                               classifier.predict(images, verbose=0), atol=1e-5)
    extractor = feature_extractor(encoder, "block2")
    extractor.save(tmp_path / "extractor.keras")
    want = pooled_features(encoder, "block2", images, CIFAR10_MEAN, CIFAR10_STD, batch_size=8)
    assert want.shape == (8, 2 * 2 * 192)
    again = keras.saving.load_model(tmp_path / "extractor.keras")
    for model in (extractor, again):
        np.testing.assert_allclose(model.predict(images, verbose=0), want, atol=1e-5)
    # both reload as the checking model (registered, in a module of registry.SERIALIZABLE)
    for model, kind in ((classifier, "classes"), (reloaded, "classes"), (extractor, "any"),
                        (again, "any")):
        assert type(model) is CheckedModel and model.labels == kind
        with pytest.raises(ValueError, match=r"\(x \* 255\)\.round\(\)\.astype"):
            model.predict(images / 255, verbose=0)
    assert CheckedModel.__module__ in SERIALIZABLE and PairsModel.__module__ in SERIALIZABLE
    with pytest.raises(ValueError, match=r"labels\.argmax\(-1\)"):
        reloaded.fit(images, np.eye(10)[labels], verbose=0)


def test_a_preset_is_its_run_directory(tmp_path, monkeypatch):
    assert presets.presets()["aetv1_cifar10"].knn_top1 == 66.33
    directory = REPO / "results" / "scale" / "aetv1_lr1e-4"
    preset, run = load_encoder("aetv1_cifar10"), load_encoder(str(directory))
    for a, b in zip(preset.get_weights(), run.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert preprocessing("aetv1_cifar10") == {"mean": CIFAR10_MEAN, "std": CIFAR10_STD}
    images = _uint8_images(4, 32)
    keras.utils.set_random_seed(0)
    from_preset = build_classifier(preset, 10, **preprocessing("aetv1_cifar10"))
    keras.utils.set_random_seed(0)
    from_run = build_classifier(run, 10, **preprocessing(directory))
    np.testing.assert_allclose(from_preset.predict(images, verbose=0),
                               from_run.predict(images, verbose=0), atol=1e-5)
    np.testing.assert_allclose(
        feature_extractor(preset, **preprocessing("aetv1_cifar10")).predict(images, verbose=0),
        pooled_features(run, "block2", images, CIFAR10_MEAN, CIFAR10_STD, batch_size=4),
        atol=1e-4)
    with pytest.raises(KeyError, match="no preset 'aetv3'.*aetv1_cifar10"):
        presets.preset_directory("aetv3")
    monkeypatch.setattr(presets, "PRESETS_ROOT", str(tmp_path / "no-checkout"))
    with pytest.raises(FileNotFoundError, match="git checkout.*pass the run directory"):
        load_encoder("aetv2_cifar10")


JAX_ROUNDTRIP = """
import sys, numpy as np, keras
from aetv2_tf.files.saving import load_encoder, save_encoder
from aetv2_tf.probes.knn import pooled_features
from aetv2_tf.data.constants import CIFAR10_MEAN, CIFAR10_STD
assert keras.backend.backend() == "jax"
images = np.load(sys.argv[1])
encoder = load_encoder(sys.argv[2])                    # saved under TensorFlow
np.save(sys.argv[3], pooled_features(encoder, None, images, CIFAR10_MEAN, CIFAR10_STD,
                                     batch_size=4))
save_encoder(encoder, sys.argv[4])                     # saved under JAX
extractor = keras.saving.load_model(sys.argv[5])       # a feature_extractor saved under TF
np.save(sys.argv[6], extractor.predict(images, verbose=0))
print("RESULT ok")
"""


@pytest.mark.slow
def test_a_custom_encoder_crosses_backends(tmp_path):
    encoder = _sequential()
    encoder.get_layer("bn1").moving_mean.assign(np.linspace(-1, 1, 8).astype("float32"))
    save_encoder(encoder, str(tmp_path / "tf"))
    images = _uint8_images(4, 16)
    np.save(tmp_path / "images.npy", images)
    extractor = feature_extractor(encoder, "block1", pool="avg2x2")
    extractor.save(tmp_path / "extractor.keras")
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['tensorflow'] = None; " + JAX_ROUNDTRIP,
         str(tmp_path / "images.npy"), str(tmp_path / "tf"), str(tmp_path / "jax.npy"),
         str(tmp_path / "jax"), str(tmp_path / "extractor.keras"),
         str(tmp_path / "extractor.npy")],
        cwd=REPO, capture_output=True, text=True, env=_env({"KERAS_BACKEND": "jax"}),
        timeout=300)
    assert "RESULT ok" in proc.stdout, proc.stderr[-3000:]
    want = pooled_features(encoder, None, images, CIFAR10_MEAN, CIFAR10_STD, batch_size=4)
    np.testing.assert_allclose(np.load(tmp_path / "jax.npy"), want, atol=1e-5)
    np.testing.assert_allclose(np.load(tmp_path / "extractor.npy"),
                               extractor.predict(images, verbose=0), atol=1e-5)
    back = load_encoder(str(tmp_path / "jax"))             # and the JAX save under TensorFlow
    np.testing.assert_allclose(
        pooled_features(back, None, images, CIFAR10_MEAN, CIFAR10_STD, batch_size=4), want,
        atol=1e-5)
