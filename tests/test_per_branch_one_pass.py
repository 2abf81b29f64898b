"""Per-branch Siamese BatchNorm in ONE encoder call on the joint batch (per-half statistics,
`models.batch_groups`) computes what two encoder calls compute: the same output, loss,
gradients and moving statistics, after one and after two training steps, on TensorFlow (the
fused and the Keras BatchNorm) and on Keras-on-JAX (a child process with TensorFlow blocked);
the grouping stays inside the pretext model; the weights load across the two layouts; an
encoder it cannot group keeps two calls.

Tolerances (float32; measured on a 2-core CPU): the output to 1e-6 (measured <= 7.5e-9); the
loss to 5e-6 of its value (measured <= 7.6e-7: 1.1e-6 on a loss of 1.42 under JAX, 0 on
TensorFlow); each variable's gradient to 1e-4 of its largest entry (measured <= 1.0e-6 on
TensorFlow, 3.4e-6 under JAX, 1.5e-5 at XLA's lowest optimisation level, which the JAX child
uses to compile faster); the moving statistics to 1e-6 of their largest entry (measured 0 to
5e-9); the trainable weights after each SGD step to 1e-4 of the largest change a weight made
(measured <= 3.7e-6).
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest

from tests import one_pass_case
from tests.cli import REPO, _env

pytestmark = pytest.mark.slow

BLOCK_TF = "import sys; sys.modules['tensorflow'] = None; "


def check(got: dict) -> None:
    assert got["groups"] == [1, 2]
    assert got["loss"] <= 5e-6 * max(1.0, got["loss_value"]) and got["output"] <= 1e-6
    assert got["grad"] <= 1e-4
    assert got["stats"] <= 1e-6 and got["stats_moved"] > 1e-2  # the statistics did move
    for step in (1, 2):
        assert got[f"weights_{step}"] <= 1e-4, (step, got)
        assert got[f"stats_{step}"] <= 1e-6, (step, got)
    assert got["moved"] > 1e-4  # the steps changed the weights


def test_one_pass_equals_two_passes_tensorflow_keras_batch_norm():
    check(one_pass_case.compare_one_and_two_passes("tiny", "keras"))


def test_one_pass_equals_two_passes_nin_tensorflow_fused():
    """The package's NIN with TensorFlow's default (fused) BatchNorm, 12 layers deep."""
    check(one_pass_case.compare_one_and_two_passes("nin", "fused"))


def test_one_pass_equals_two_passes_jax():
    """Keras on JAX (`stateless_call` in `jax.jit`: each half's update is carried through the
    stateless scope in turn). XLA's cheaper CPU compilation: the same program for both."""
    code = BLOCK_TF + ("import json, sys; sys.path.insert(0, 'tests'); import one_pass_case; "
                       "print('RESULT', json.dumps("
                       "one_pass_case.compare_one_and_two_passes('tiny', 'keras')))")
    env = _env({"KERAS_BACKEND": "jax", "XLA_FLAGS": "--xla_backend_optimization_level=0 "
                                                     "--xla_llvm_disable_expensive_passes=true"})
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")][-1]
    check(json.loads(line.split(" ", 1)[1]))


def test_the_groups_stay_inside_the_pretext_model():
    """A classifier on the same encoder, called after (and beside) the one-pass pretext
    model's training step, normalises by the whole batch's statistics, as an encoder that
    never was in a pretext model does."""
    from aetv2_tf.models.batch_groups import (
        batch_statistics_groups,
        current_batch_statistics_groups,
    )

    encoder = one_pass_case.tiny_bn_encoder("keras")
    pretext = one_pass_case.build_model_on(encoder, one_pass=True)
    assert pretext.batch_groups == 2
    images = np.random.default_rng(1).integers(0, 256, (4, 16, 16, 3), np.uint8)
    pretext.train_on_batch(images)
    assert current_batch_statistics_groups() == 1

    def classifier(enc):
        x = keras.layers.GlobalAveragePooling2D()(enc.output)
        return keras.Model(enc.input, keras.layers.Dense(3)(x))

    twin = one_pass_case.tiny_bn_encoder("keras")
    twin.set_weights(encoder.get_weights())
    mine, theirs = classifier(encoder), classifier(twin)
    theirs.set_weights(mine.get_weights())
    batch = np.random.default_rng(2).standard_normal((4, 16, 16, 3)).astype("float32")
    batch[2:] = 3.0 * batch[2:] + 1.0  # halves with other statistics
    got, want = mine(batch, training=True), theirs(batch, training=True)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(got),
                                  keras.ops.convert_to_numpy(want))
    for a, b in zip(encoder.non_trainable_variables, twin.non_trainable_variables, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with batch_statistics_groups(2):  # (and the halves would give another thing)
        grouped = theirs(batch, training=True)
    assert np.max(np.abs(keras.ops.convert_to_numpy(grouped) -
                         keras.ops.convert_to_numpy(want))) > 1e-3
    assert current_batch_statistics_groups() == 1


def test_weights_load_across_one_and_two_passes(tmp_path):
    """The same variables by the same paths: `.weights.h5` of either layout loads into the
    other (and into "joint"); a one-pass model saved whole reloads one-pass."""
    import h5py

    from aetv2_tf.models.aet import build_aet_model

    one = one_pass_case.build_model_on(one_pass_case.tiny_bn_encoder("keras"), one_pass=True)
    two = one_pass_case.build_model_on(one_pass_case.tiny_bn_encoder("keras"), one_pass=False)
    assert [v.path for v in one.weights] == [v.path for v in two.weights]
    images = np.random.default_rng(3).integers(0, 256, (4, 16, 16, 3), np.uint8)
    one.train_on_batch(images)  # weights and moving statistics of its own
    one.save_weights(tmp_path / "one.weights.h5")
    two.load_weights(tmp_path / "one.weights.h5")
    for a, b in zip(one.get_weights(), two.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    two.save_weights(tmp_path / "two.weights.h5")

    def variables(path):
        found = {}
        with h5py.File(path) as f:
            f.visititems(lambda k, v: found.update({k: v[()]}) if hasattr(v, "shape") else None)
        return found

    a, b = variables(tmp_path / "one.weights.h5"), variables(tmp_path / "two.weights.h5")
    assert sorted(a) == sorted(b) and any("batch_normalization_1/" in k for k in a)
    fresh = one_pass_case.build_model_on(one_pass_case.tiny_bn_encoder("keras"), one_pass=True)
    fresh.load_weights(tmp_path / "two.weights.h5")
    for x, y in zip(one.get_weights(), fresh.get_weights(), strict=True):
        np.testing.assert_array_equal(x, y)
    joint = build_aet_model(one_pass_case.tiny_bn_encoder("keras"), siamese_batch_norm="joint")
    standalone = build_aet_model(one_pass_case.tiny_bn_encoder("keras"), one_pass=True)
    assert type(standalone).__name__ == "OnePassSiamese" and standalone.batch_groups == 2
    joint.save_weights(tmp_path / "joint.weights.h5")
    standalone.load_weights(tmp_path / "joint.weights.h5")

    one.save(tmp_path / "one.keras")
    reloaded = keras.saving.load_model(tmp_path / "one.keras", compile=False)
    assert reloaded.batch_groups == 2
    pairs = one.get_layer("pairs")
    x, tx, _ = pairs(images)
    inner = one.get_layer("aet")
    want = inner([x, tx], training=False)
    got = reloaded.get_layer("aet")([x, tx], training=False)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(got),
                               keras.ops.convert_to_numpy(want), atol=1e-6)


def test_keras_batch_norm_keeps_its_name_and_loads_presets(tmp_path):
    """`make_batch_norm("keras")` is group-aware under Keras's class name, so the weight paths
    (and the presets) are those of `keras.layers.BatchNormalization`; a `.keras` file written
    with Keras's own class reloads as Keras's class."""
    from aetv2_tf.files.saving import load_encoder
    from aetv2_tf.models.batch_groups import BatchNormalization
    from aetv2_tf.models.blocks import make_batch_norm

    layer = make_batch_norm("keras", name="bn")
    assert type(layer) is BatchNormalization and type(layer).__name__ == "BatchNormalization"
    assert isinstance(layer, keras.layers.BatchNormalization)
    preset = load_encoder("aetv1_cifar10")  # the package's weights, written with Keras's class
    kinds = {type(x) for x in preset._flatten_layers() if "batchnorm" in type(x).__name__.lower()}
    assert kinds == {BatchNormalization}
    inputs = keras.Input((4, 4, 3))
    for cls in (keras.layers.BatchNormalization, BatchNormalization):
        keras.Model(inputs, cls(name="bn")(inputs)).save(tmp_path / "bn.keras")
        reloaded = keras.saving.load_model(tmp_path / "bn.keras")
        assert type(reloaded.get_layer("bn")) is cls


class _OwnBatchNorm(keras.layers.BatchNormalization):
    """A user's BatchNorm subclass: its computation is its own, so it is not grouped."""


@pytest.mark.parametrize("kind", ["subclass", "keras", "dropout"])
def test_an_encoder_it_cannot_group_keeps_two_calls(kind):
    from aetv2_tf.models.aet import build_aet_model
    from aetv2_tf.models.batch_groups import one_pass_blockers

    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, use_bias=False)(inputs)
    x = {"subclass": _OwnBatchNorm(), "keras": keras.layers.BatchNormalization(),
         "dropout": keras.layers.Dropout(0.5)}[kind](x)
    encoder = keras.Model(inputs, x, name=f"user_{kind}")
    assert len(one_pass_blockers(encoder)) == 1
    with pytest.warns(UserWarning, match="two encoder calls"):
        model = build_aet_model(encoder, one_pass=True)
    assert model.batch_groups == 1 and model.get_layer("after_x") is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert build_aet_model(encoder).batch_groups == 1  # None: no warning


def test_defaults_and_refusals():
    """One pass is off by default on a CPU; "joint" has no two-call form; one_pass takes a
    bool; the package's NIN is group-aware."""
    from aetv2_tf.models import build_backbone
    from aetv2_tf.models.aet import build_aet_model
    from aetv2_tf.models.batch_groups import batch_statistics_groups, one_pass_blockers

    encoder = one_pass_case.tiny_bn_encoder("fused")
    assert build_aet_model(encoder).batch_groups == 1  # a CPU: the two calls of before
    assert one_pass_case.build_model_on(encoder, one_pass=None).batch_groups == 1
    assert one_pass_blockers(build_backbone("nin", (32, 32, 3))) == []
    assert one_pass_blockers(build_backbone("nin", (32, 32, 3), batch_norm="keras")) == []
    with pytest.raises(ValueError, match="per_branch"):
        build_aet_model(encoder, siamese_batch_norm="joint", one_pass=True)
    with pytest.raises(ValueError, match="one_pass"):
        build_aet_model(encoder, one_pass="yes")
    with pytest.raises(ValueError, match="groups"):
        with batch_statistics_groups(0):
            pass
