"""Issue 32 (asks 1 and 5): bad inputs to the library are refused at the door, each with a
message that names the problem and the fix (`aetv2_tf.input_checks`); good uint8 input still works.
One subprocess checks the same under ``KERAS_BACKEND=jax``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import aetv2_tf
from aetv2_tf import input_checks
from aetv2_tf.probes.knn import extract_features, knn_accuracy, knn_classify, make_feature_fn
from tests.cli import REPO

MEAN, STD = aetv2_tf.CIFAR10_MEAN, aetv2_tf.CIFAR10_STD
RNG = np.random.default_rng(0)
IMAGES = RNG.integers(0, 256, (16, 32, 32, 3), dtype=np.uint8)
LABELS = np.arange(16) % 4


@pytest.fixture(scope="module")
def encoder():
    keras.utils.set_random_seed(0)
    return aetv2_tf.build_backbone("nin")


@pytest.fixture(scope="module")
def model(encoder):
    model = aetv2_tf.build_pairs_model(encoder, seed=0)
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_float_images_refused_with_their_range_and_the_fix(model, encoder):
    x01 = IMAGES.astype("float32") / 255
    with pytest.raises(ValueError, match=r"in \[0, 1\].*\(x \* 255\)\.round\(\)\.astype"):
        model.fit(x01, batch_size=8, epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"\(x \* 255\)\.round\(\)\.astype\(\"uint8\"\)"):
        aetv2_tf.pooled_features(encoder, "block2", x01, MEAN, STD)
    with pytest.raises(ValueError, match=r"values in \[0, 255\].*x\.astype\(\"uint8\"\)"):
        model.fit(IMAGES.astype("float32"), batch_size=8, verbose=0)
    normalised = (x01 - np.float32(MEAN)) / np.float32(STD)
    with pytest.raises(ValueError, match="normalised already.*raw uint8"):
        model.predict(normalised, verbose=0)


def test_labels_to_a_self_supervised_fit_refused(model):
    with pytest.raises(ValueError, match="self-supervised: the pairs are the targets; pass the "
                                         "images only.*model.fit\\(images\\)"):
        model.fit(IMAGES, LABELS, batch_size=8, verbose=0)
    with pytest.raises(ValueError, match="self-supervised"):
        model.evaluate(IMAGES, LABELS, verbose=0)
    pairs = tf.data.Dataset.from_tensor_slices((IMAGES, LABELS)).batch(8)
    with pytest.raises(ValueError, match=r"pass the images only, e\.g\. "
                                         r"dataset\.map\(lambda x, y: x\)"):
        model.fit(pairs, epochs=1, verbose=0)
    floats = tf.data.Dataset.from_tensor_slices(IMAGES.astype("float32") / 255).batch(8)
    with pytest.raises(ValueError, match=r"float32 images.*tf\.cast\(tf\.round\(x \* 255\), "
                                         r"tf\.uint8\)"):
        model.fit(floats, epochs=1, verbose=0)


def test_nchw_and_wrong_size_refused(model, encoder):
    nchw = np.transpose(IMAGES, (0, 3, 1, 2))
    fix = r"NCHW.*np\.transpose\(x, \(0, 2, 3, 1\)\)"
    with pytest.raises(ValueError, match=fix):
        model.fit(nchw, batch_size=8, verbose=0)
    with pytest.raises(ValueError, match=fix):
        aetv2_tf.pooled_features(encoder, "block2", nchw, MEAN, STD)
    big = np.zeros((2, 64, 64, 3), np.uint8)
    size = r"64x64 pixels; the encoder takes 32x32.*resize or crop"
    with pytest.raises(ValueError, match=size):
        model.fit(big, verbose=0)
    with pytest.raises(ValueError, match=size):
        aetv2_tf.pooled_features(encoder, "block2", big, MEAN, STD)
    with pytest.raises(ValueError, match=r"one image; pass a batch.*x\[None\]"):
        model.predict(IMAGES[0], verbose=0)


def test_unknown_feature_lists_the_available_ones(encoder):
    names = r"\['block1', 'block2', 'block3', 'block4'\]"
    with pytest.raises(ValueError, match=f"unknown feature 'block5'.*{names}"):
        aetv2_tf.pooled_features(encoder, "block5", IMAGES, MEAN, STD)
    with pytest.raises(ValueError, match=f"unknown feature 'block5'.*{names}"):
        make_feature_fn(encoder, "block5")
    with pytest.raises(TypeError, match="feature must be a name"):
        input_checks.check_feature(2, ["block2"])


def test_one_hot_and_mismatched_labels_refused():
    feats = RNG.standard_normal((16, 5)).astype("float32")
    one_hot = np.eye(4)[LABELS]
    with pytest.raises(ValueError, match=r"one-hot.*labels\.argmax\(-1\)"):
        knn_accuracy(feats, one_hot, feats, LABELS, k=3)
    with pytest.raises(ValueError, match=r"query_labels.*one-hot.*argmax\(-1\)"):
        knn_accuracy(feats, LABELS, feats, one_hot, k=3)
    with pytest.raises(ValueError, match="15 labels for 16 training features"):
        knn_classify(feats, LABELS[:15], feats, k=3)
    with pytest.raises(ValueError, match="not whole numbers"):
        knn_classify(feats, LABELS + 0.5, feats, k=3)
    ds = tf.data.Dataset.from_tensor_slices((IMAGES.astype("float32"), one_hot)).batch(8)
    with pytest.raises(ValueError, match=r"argmax\(-1\)"):
        extract_features(lambda x: x, ds, pool="global")
    # (N, 1) columns (keras.datasets' layout) and whole floats are taken as class indices.
    assert knn_accuracy(feats, LABELS[:, None], feats, LABELS.astype("float32"), k=1) == 100.0


def test_good_uint8_input_still_works(model, encoder):
    history = model.fit(IMAGES, batch_size=8, epochs=1, steps_per_epoch=1, verbose=0)
    assert np.isfinite(history.history["loss"][-1])
    dataset = tf.data.Dataset.from_tensor_slices(IMAGES).batch(8)
    assert np.isfinite(model.evaluate(dataset, verbose=0))
    assert model.predict(IMAGES[:8], verbose=0).shape == (8, 16)
    feats = aetv2_tf.pooled_features(encoder, "block2", IMAGES, MEAN, STD, batch_size=8)
    assert feats.shape == (16, 3072) and feats.dtype == np.float32
    assert 0.0 <= knn_accuracy(feats, LABELS, feats, LABELS, k=1) <= 100.0


FLOATS_FIX = r"in \[0, 1\].*\(x \* 255\)\.round\(\)\.astype\(\"uint8\"\)"


def test_pairs_model_checks_its_on_batch_calls(model):
    with pytest.raises(ValueError, match=r"PairsModel\.train_on_batch.*" + FLOATS_FIX):
        model.train_on_batch(IMAGES.astype("float32") / 255)
    with pytest.raises(ValueError, match=r"train_on_batch: y was given.*self-supervised"):
        model.train_on_batch(IMAGES, LABELS)
    with pytest.raises(ValueError, match=r"PairsModel\.test_on_batch.*NCHW"):
        model.test_on_batch(np.transpose(IMAGES, (0, 3, 1, 2)))
    with pytest.raises(ValueError, match=r"PairsModel\.predict_on_batch.*" + FLOATS_FIX):
        model.predict_on_batch(IMAGES.astype("float32") / 255)
    assert np.isfinite(model.train_on_batch(IMAGES[:8]))
    assert np.isfinite(model.test_on_batch(IMAGES[:8]))
    assert model.predict_on_batch(IMAGES[:8]).shape == (8, 16)


def test_an_unbatched_dataset_is_told_to_batch(model):
    unbatched = tf.data.Dataset.from_tensor_slices(IMAGES)
    with pytest.raises(ValueError, match=r"one image; pass a batch.*dataset\.batch\(n\)") as e:
        model.fit(unbatched, epochs=1, verbose=0)
    assert "x[None]" not in str(e.value)


def test_the_classifier_and_the_extractor_check_their_inputs(encoder):
    """`build_classifier` / `feature_extractor` (a `CheckedModel`): floats, NCHW, a wrong size
    refused as by the pairs model; the classifier's labels: integer class indices."""
    classifier = aetv2_tf.build_classifier(encoder, 4)
    classifier.compile(optimizer="sgd",
                       loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x01, one_hot = IMAGES.astype("float32") / 255, np.eye(4)[LABELS]
    with pytest.raises(ValueError, match=r"CheckedModel\.fit: x.*" + FLOATS_FIX):
        classifier.fit(x01, LABELS, verbose=0)
    with pytest.raises(ValueError, match=r"CheckedModel\.fit: y.*one-hot.*labels\.argmax\(-1\)"):
        classifier.fit(IMAGES, one_hot, verbose=0)
    with pytest.raises(ValueError, match=r"no labels.*model\.fit\(images, labels\)"):
        classifier.fit(IMAGES, verbose=0)
    with pytest.raises(ValueError, match=r"labels in \[4, 7\]; the model has 4 classes"):
        classifier.fit(IMAGES, LABELS + 4, verbose=0)
    with pytest.raises(ValueError, match="15 labels for 16 images"):
        classifier.evaluate(IMAGES, LABELS[:15], verbose=0)
    with pytest.raises(ValueError, match=r"fit\(validation_data=\.\.\.\).*" + FLOATS_FIX):
        classifier.fit(IMAGES, LABELS, validation_data=(x01, LABELS), verbose=0)
    with pytest.raises(ValueError, match=r"CheckedModel\.train_on_batch.*" + FLOATS_FIX):
        classifier.train_on_batch(x01, LABELS)
    with pytest.raises(ValueError, match=r"CheckedModel\.test_on_batch.*argmax\(-1\)"):
        classifier.test_on_batch(IMAGES, one_hot)
    with pytest.raises(ValueError, match=r"CheckedModel\.predict_on_batch.*NCHW"):
        classifier.predict_on_batch(np.transpose(IMAGES, (0, 3, 1, 2)))
    one_hot_ds = tf.data.Dataset.from_tensor_slices((IMAGES, one_hot)).batch(8)
    with pytest.raises(ValueError, match=r"one-hot.*tf\.argmax\(y, -1\)"):
        classifier.fit(one_hot_ds, verbose=0)
    with pytest.raises(ValueError, match=r"images only; a classifier needs \(images, labels\)"):
        classifier.fit(tf.data.Dataset.from_tensor_slices(IMAGES).batch(8), verbose=0)
    extractor = aetv2_tf.feature_extractor(encoder)
    with pytest.raises(ValueError, match=r"CheckedModel\.predict: x.*" + FLOATS_FIX):
        extractor.predict(x01, verbose=0)
    with pytest.raises(ValueError, match=r"64x64 pixels; the encoder takes 32x32"):
        extractor.predict(np.zeros((2, 64, 64, 3), np.uint8), verbose=0)
    # the good inputs: uint8 images with integer labels, as arrays, (N, 1) or a dataset
    history = classifier.fit(IMAGES, LABELS[:, None], batch_size=8, epochs=1, verbose=0,
                             validation_data=(IMAGES[:8], LABELS[:8]))
    assert np.isfinite(history.history["val_loss"][-1])
    pairs = tf.data.Dataset.from_tensor_slices((IMAGES, LABELS)).batch(8)
    assert np.isfinite(classifier.evaluate(pairs, verbose=0))
    assert extractor.predict(IMAGES[:4], verbose=0).shape == (4, 3072)


JAX_SCRIPT = textwrap.dedent("""
    import os
    import sys
    sys.modules["tensorflow"] = None  # any TensorFlow import now fails: the checks need none
    import numpy as np
    import keras
    import aetv2_tf
    assert keras.backend.backend() == "jax", keras.backend.backend()

    encoder = aetv2_tf.build_backbone("nin", (16, 16, 3))
    model = aetv2_tf.build_pairs_model(encoder, seed=0)
    model.compile(optimizer="sgd", loss="mse")
    classifier = aetv2_tf.build_classifier(encoder, 4)
    extractor = aetv2_tf.feature_extractor(encoder)
    images = np.random.default_rng(0).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
    labels = np.arange(4) % 4
    feats = np.random.default_rng(1).standard_normal((4, 5)).astype("float32")
    mean, std = aetv2_tf.CIFAR10_MEAN, aetv2_tf.CIFAR10_STD
    CASES = [
        ("fit_float01", lambda: model.fit(images.astype("float32") / 255, verbose=0)),
        ("fit_float255", lambda: model.fit(images.astype("float32"), verbose=0)),
        ("fit_nchw", lambda: model.fit(np.transpose(images, (0, 3, 1, 2)), verbose=0)),
        ("fit_size", lambda: model.fit(np.zeros((2, 32, 32, 3), np.uint8), verbose=0)),
        ("fit_labels", lambda: model.fit(images, labels, verbose=0)),
        ("train_on_batch_float", lambda: model.train_on_batch(images / 255)),
        ("knn_one_hot", lambda: aetv2_tf.knn_accuracy(feats, np.eye(4)[labels], feats, labels,
                                                      k=1)),
        ("features_float", lambda: aetv2_tf.pooled_features(encoder, "block2", images / 255,
                                                            mean, std)),
        ("feature", lambda: aetv2_tf.pooled_features(encoder, "block5", images, mean, std)),
        ("save_recipe", lambda: aetv2_tf.save_encoder(encoder, "saved", recipe=3)),
        ("classifier_float", lambda: classifier.fit(images / 255, labels, verbose=0)),
        ("classifier_one_hot", lambda: classifier.fit(images, np.eye(4)[labels], verbose=0)),
        ("extractor_float", lambda: extractor.predict(images / 255, verbose=0)),
        ("as_recipe", lambda: aetv2_tf.as_recipe("nope")),
        ("export", lambda: aetv2_tf.export_encoder(encoder, "exported")),
    ]
    for name, call in CASES:
        try:
            call()
            print(name, "ACCEPTED")
        except Exception as e:
            print(name, type(e).__name__, str(e).replace("\\n", " "))
    print("saved_dir", os.path.exists("saved"))
""")

#: The JAX script's refusals: (exception type, the fix the message must name).
JAX_REFUSALS = {
    "fit_float01": ("UsageError", '(x * 255).round().astype("uint8")'),
    "fit_float255": ("UsageError", 'x.astype("uint8")'),
    "fit_nchw": ("UsageError", "np.transpose(x, (0, 2, 3, 1))"),
    "fit_size": ("UsageError", "resize or crop them"),
    "fit_labels": ("UsageError", "model.fit(images), without y"),
    "train_on_batch_float": ("UsageError", '(x * 255).round().astype("uint8")'),
    "knn_one_hot": ("UsageError", "labels.argmax(-1)"),
    "features_float": ("UsageError", '(x * 255).round().astype("uint8")'),
    "feature": ("UsageError", "['block1', 'block2', 'block3', 'block4']"),
    "save_recipe": ("TypeError", "expected a Recipe, e.g. aetv2_tf.AETV2"),
    "classifier_float": ("UsageError", '(x * 255).round().astype("uint8")'),
    "classifier_one_hot": ("UsageError", "labels.argmax(-1)"),
    "extractor_float": ("UsageError", '(x * 255).round().astype("uint8")'),
    "as_recipe": ("TypeError", "expected a Recipe, e.g. aetv2_tf.AETV2"),
    "export": ("RuntimeError", "KERAS_BACKEND=tensorflow"),
}


@pytest.mark.slow
def test_jax_refuses_the_same_inputs(tmp_path):
    """Under KERAS_BACKEND=jax, TensorFlow blocked: the whole refusal table (float [0, 1] and
    [0, 255] images, NCHW, a wrong size, labels to a self-supervised fit, one-hot labels, an
    unknown feature, a bad recipe, a classifier / extractor on floats), one case per line, each
    naming its fix; export_encoder names KERAS_BACKEND=tensorflow and the alternative, before
    writing; nothing is written by a refused save_encoder."""
    (tmp_path / "check.py").write_text(JAX_SCRIPT)
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="2",
               JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "check.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = {line.split(" ", 1)[0]: line for line in proc.stdout.splitlines()}
    for name, (error, fix) in JAX_REFUSALS.items():
        assert name in lines, (name, proc.stdout[-3000:])
        assert lines[name].split(" ", 2)[1] == error and fix in lines[name], lines[name]
    assert "'block5'" in lines["feature"]
    assert "save_encoder" in lines["export"] and "python -m aetv2_tf.export" in lines["export"]
    assert lines["saved_dir"] == "saved_dir False"
    assert not (tmp_path / "exported").exists() and not (tmp_path / "saved").exists()
