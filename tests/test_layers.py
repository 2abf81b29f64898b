"""FusedBatchNormalization against keras.layers.BatchNormalization; AdaptivePooling2D vs NumPy."""

import os
import pathlib
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from aetv2_tf.models.blocks import (
    AdaptivePooling2D,
    FusedBatchNormalization,
    conv_bn_relu,
    dense_bn_relu,
)

SHAPES = {"4d": (6, 5, 7, 8), "2d": (16, 8)}


def _pair(shape, dtype="float32", **kwargs):
    """A built (fused, keras) pair of BN layers with identical, non-trivial weights."""
    kwargs = {"momentum": 0.8, "epsilon": 1e-5, **kwargs}
    fused = FusedBatchNormalization(dtype=dtype, **kwargs)
    ref = keras.layers.BatchNormalization(dtype=dtype, **kwargs)
    fused.build(shape)
    ref.build(shape)
    rng = np.random.default_rng(0)
    weights = []
    for w in ref.weights:
        if "variance" in w.name:
            weights.append(rng.uniform(0.5, 2.0, w.shape).astype("float32"))
        else:
            weights.append(rng.normal(size=w.shape).astype("float32"))
    ref.set_weights(weights)
    fused.set_weights(weights)
    return fused, ref


def _inputs(shape, seed=1):
    rng = np.random.default_rng(seed)
    return tf.constant(rng.normal(1.5, 3.0, size=shape).astype("float32"))


@pytest.mark.parametrize("rank", ["4d", "2d"])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("training", [True, False])
def test_forward_and_gradients_match_keras_float32(rank, affine, training):
    shape = SHAPES[rank]
    fused, ref = _pair(shape, center=affine, scale=affine)
    x = _inputs(shape)
    upstream = _inputs(shape, seed=2)
    results = []
    for layer in (fused, ref):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=training)
            loss = tf.reduce_sum(y * upstream)
        grads = tape.gradient(loss, [x, *layer.trainable_weights])
        results.append((y, grads))
    (y_f, g_f), (y_r, g_r) = results
    assert y_f.dtype == tf.float32 and y_f.shape == shape
    np.testing.assert_allclose(y_f, y_r, atol=2e-5, rtol=1e-5)
    assert len(g_f) == len(g_r) == (3 if affine else 1)
    for a, b in zip(g_f, g_r, strict=True):
        np.testing.assert_allclose(a, b, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("rank", ["4d", "2d"])
def test_moving_statistics_match_keras_after_several_steps(rank):
    shape = SHAPES[rank]
    fused, ref = _pair(shape)
    initial = [w.numpy() for w in ref.non_trainable_weights]
    for step in range(5):
        x = _inputs(shape, seed=10 + step)
        fused(x, training=True)
        ref(x, training=True)
    for name, start in zip(("moving_mean", "moving_variance"), initial, strict=True):
        a, b = getattr(fused, name).numpy(), getattr(ref, name).numpy()
        assert not np.allclose(a, start)
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    # Keras tracks the BIASED batch variance: check against NumPy for one step.
    fresh, _ = _pair(shape, momentum=0.0)
    x = _inputs(shape, seed=99)
    fresh(x, training=True)
    flat = x.numpy().reshape(-1, shape[-1])
    np.testing.assert_allclose(fresh.moving_variance.numpy(), flat.var(0), rtol=1e-5)
    np.testing.assert_allclose(fresh.moving_mean.numpy(), flat.mean(0), rtol=1e-5, atol=1e-6)


def test_frozen_layer_runs_in_inference_mode_like_keras():
    shape = SHAPES["4d"]
    fused, ref = _pair(shape)
    fused.trainable = ref.trainable = False
    x = _inputs(shape)
    np.testing.assert_allclose(fused(x, training=True), ref(x, training=True), atol=2e-5)
    np.testing.assert_allclose(fused.moving_mean.numpy(), ref.moving_mean.numpy())


@pytest.mark.parametrize("training", [True, False])
def test_mixed_bfloat16_matches_keras(training):
    shape = SHAPES["4d"]
    fused, ref = _pair(shape, dtype="mixed_bfloat16")
    assert all(w.dtype == "float32" for w in fused.weights)
    x = _inputs(shape)
    upstream = tf.cast(_inputs(shape, seed=2), tf.bfloat16)
    results = []
    for layer in (fused, ref):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=training)
            loss = tf.reduce_sum(tf.cast(y * upstream, tf.float32))
        results.append((y, tape.gradient(loss, [x, *layer.trainable_weights])))
    (y_f, g_f), (y_r, g_r) = results
    assert y_f.dtype == tf.bfloat16
    scale = float(np.abs(y_r.numpy().astype("float32")).max())
    np.testing.assert_allclose(
        tf.cast(y_f, tf.float32), tf.cast(y_r, tf.float32), atol=0.02 * scale
    )
    for a, b in zip(g_f, g_r, strict=True):
        a, b = tf.cast(a, tf.float32).numpy(), tf.cast(b, tf.float32).numpy()
        np.testing.assert_allclose(a, b, atol=0.03 * np.abs(b).max())
    np.testing.assert_allclose(fused.moving_mean.numpy(), ref.moving_mean.numpy(), atol=0.02)
    np.testing.assert_allclose(
        fused.moving_variance.numpy(), ref.moving_variance.numpy(), rtol=0.02
    )


def _small_model(batch_norm: str) -> keras.Model:
    inputs = keras.Input((8, 8, 3))
    x = conv_bn_relu(inputs, 4, 3, name="c1", batch_norm=batch_norm)
    x = keras.layers.Flatten()(x)
    x = dense_bn_relu(x, 5, name="fc", batch_norm=batch_norm)
    return keras.Model(inputs, x)


def test_serialization_roundtrip(tmp_path):
    layer = FusedBatchNormalization(momentum=0.7, epsilon=1e-4, center=False, name="bn")
    clone = FusedBatchNormalization.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    revived = keras.layers.deserialize(keras.layers.serialize(layer))
    assert isinstance(revived, FusedBatchNormalization) and revived.momentum == 0.7

    model = _small_model("fused")
    x = _inputs((2, 8, 8, 3))
    model(x, training=True)  # move the statistics away from their init
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.get_layer("c1_bn"), FusedBatchNormalization)
    np.testing.assert_allclose(loaded(x), model(x), atol=1e-6)


def test_keras_bn_weights_load_into_fused_model(tmp_path):
    keras_model, fused_model = _small_model("keras"), _small_model("fused")
    x = _inputs((4, 8, 8, 3))
    for _ in range(2):
        keras_model(x, training=True)
    assert [w.name for w in fused_model.weights] == [w.name for w in keras_model.weights]
    fused_model.set_weights(keras_model.get_weights())
    np.testing.assert_allclose(fused_model(x), keras_model(x), atol=1e-5)
    # Object-based TF checkpoints restore across the two as well.
    prefix = tf.train.Checkpoint(model=keras_model).save(str(tmp_path / "ckpt"))
    other = _small_model("fused")
    tf.train.Checkpoint(model=other).restore(prefix).assert_existing_objects_matched()
    np.testing.assert_allclose(other(x), keras_model(x), atol=1e-5)


FUSED_BN_MIRRORED = textwrap.dedent(
    """
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    import numpy as np
    from aetv2_tf.models.blocks import FusedBatchNormalization

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(8, 4, 4, 3)) * 2 + 1).astype("float32")
    y = rng.normal(size=(8, 4, 4, 3)).astype("float32")
    stats = {}
    for cls in (FusedBatchNormalization, keras.layers.BatchNormalization):
        with strategy.scope():
            keras.utils.set_random_seed(1)
            inputs = keras.Input((4, 4, 3))
            bn = cls(momentum=0.5, name="bn")
            model = keras.Model(inputs, keras.layers.Conv2D(3, 1)(bn(inputs)))
            model.compile("sgd", "mse")
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        stats[cls.__name__] = [w.numpy() for w in model.get_layer("bn").weights]
    for a, b in zip(*stats.values()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert not np.allclose(stats["FusedBatchNormalization"][2], 0.0)
    print("OK")
    """
)


@pytest.mark.slow
def test_mirrored_strategy_matches_keras_bn():
    """Two logical CPUs must be configured before TF starts: run in a fresh interpreter."""
    repo = str(pathlib.Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", FUSED_BN_MIRRORED],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=repo,
    )
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]


def _adaptive_reference(x: np.ndarray, out: int, mode: str) -> np.ndarray:
    """Direct transcription of torch.nn.AdaptiveAvgPool2d/AdaptiveMaxPool2d for NHWC."""
    b, h, w, c = x.shape
    y = np.zeros((b, out, out, c), x.dtype)
    for i in range(out):
        r0, r1 = (i * h) // out, int(np.ceil((i + 1) * h / out))
        for j in range(out):
            c0, c1 = (j * w) // out, int(np.ceil((j + 1) * w / out))
            window = x[:, r0:r1, c0:c1, :]
            y[:, i, j] = window.mean(axis=(1, 2)) if mode == "avg" else window.max(axis=(1, 2))
    return y


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize(("size", "out"), [(8, 7), (13, 5), (13, 6), (55, 12), (27, 7), (6, 6)])
def test_adaptive_pooling_matches_reference(mode, size, out):
    x = np.random.default_rng(size).normal(size=(2, size, size, 3)).astype("float32")
    y = AdaptivePooling2D(out, mode=mode)(x)
    assert y.shape == (2, out, out, 3)
    np.testing.assert_allclose(y, _adaptive_reference(x, out, mode), atol=1e-5)
