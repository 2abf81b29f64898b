"""Issue 32 (asks 1 and 5): bad inputs to the library are refused at the door, each with a
message that names the problem and the fix (`aetv2_tf.inputs`); good uint8 input still works.
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
from aetv2_tf import inputs
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
        inputs.check_feature(2, ["block2"])


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


JAX_SCRIPT = textwrap.dedent("""
    import numpy as np
    import aetv2_tf

    encoder = aetv2_tf.build_backbone("nin")
    model = aetv2_tf.build_pairs_model(encoder, seed=0)
    model.compile(optimizer="sgd", loss="mse")
    images = np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    for name, call in [
        ("fit", lambda: model.fit(images.astype("float32") / 255, verbose=0)),
        ("feature", lambda: aetv2_tf.pooled_features(encoder, "block5", images,
                                                     aetv2_tf.CIFAR10_MEAN, aetv2_tf.CIFAR10_STD)),
        ("export", lambda: aetv2_tf.export_encoder(encoder, "exported")),
    ]:
        try:
            call()
            print(name, "ACCEPTED")
        except Exception as e:
            print(name, type(e).__name__, str(e).replace("\\n", " "))
""")


def test_jax_refuses_the_same_inputs(tmp_path):
    """Under KERAS_BACKEND=jax: float images to fit and an unknown feature refused with the fix;
    export_encoder names KERAS_BACKEND=tensorflow and the alternative, before writing."""
    (tmp_path / "check.py").write_text(JAX_SCRIPT)
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="2",
               JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "check.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = {line.split(" ", 1)[0]: line for line in proc.stdout.splitlines()}
    assert "UsageError" in lines["fit"] and '(x * 255).round().astype("uint8")' in lines["fit"]
    assert "UsageError" in lines["feature"] and "'block5'" in lines["feature"] \
        and "'block2'" in lines["feature"]
    assert "RuntimeError" in lines["export"] and "KERAS_BACKEND=tensorflow" in lines["export"] \
        and "save_encoder" in lines["export"] and "python -m aetv2_tf.export" in lines["export"]
    assert not (tmp_path / "exported").exists()
