"""aetv2_tf.method.losses: values against a float64 numpy oracle, serialization, mixed precision,
the per-sample non-finite guard and adversarial inputs. Run with ``-s`` to see the measured
errors."""

import keras
import numpy as np
import pytest
import scipy.linalg
import tensorflow as tf
from scipy.spatial.transform import Rotation

from aetv2_tf.method import losses
from aetv2_tf.method.geometry import matrix_to_params, params_to_matrix
from tests.numerics import R90, adversarial_pairs, check_close, random_params


def np_geodesic_loss(p_true, p_pred, projection_weight=1.0):
    """Independent float64 oracle of Eq. (11) on (B, 8) parameters (numpy + scipy)."""
    out = []
    for a, b in zip(p_true, p_pred, strict=True):
        t, t_hat = (np.append(x, 1.0).reshape(3, 3) for x in (a, b))
        m = np.linalg.inv(t) @ t_hat
        m = m / np.cbrt(np.linalg.det(m))
        q, h = scipy.linalg.polar(m)
        if np.linalg.det(q) < 0:
            v = np.linalg.eigh(h)[1][:, 0]
            q = q @ (np.eye(3) - 2 * np.outer(v, v))
        out.append(Rotation.from_matrix(q).magnitude() + projection_weight * np.sum((m - q) ** 2))
    return np.array(out)


@pytest.fixture
def float32_policy_after():
    """Whatever a test does to the global dtype policy, restore float32."""
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


def loss_and_gradient(loss_fn, y_true, y_pred):
    y_pred = tf.convert_to_tensor(y_pred)
    with tf.GradientTape() as tape:
        tape.watch(y_pred)
        loss = loss_fn(tf.convert_to_tensor(y_true), y_pred)
    return loss, tape.gradient(loss, y_pred)


# ----------------------------------------------------------------------------- values
@pytest.mark.parametrize("weight", [1.0, 0.0, 2.5])
def test_geodesic_loss_matches_numpy(weight):
    y_true, y_pred = random_params(32, 0), random_params(32, 1)
    flipped = params_to_matrix(y_pred[::3]).numpy() @ np.diag([1.0, -1.0, 1.0]).astype(np.float32)
    y_pred[::3] = matrix_to_params(flipped).numpy()
    loss = losses.GeodesicLoss(projection_weight=weight)
    ref = np_geodesic_loss(y_true.astype(np.float64), y_pred.astype(np.float64), weight)
    per_sample = loss.call(y_true, y_pred)
    assert per_sample.shape == (32,) and per_sample.dtype == tf.float32
    check_close(f"GeodesicLoss per sample float32 (lambda={weight})", per_sample, ref, 1e-5)
    check_close(f"GeodesicLoss batch mean float32 (lambda={weight})", loss(y_true, y_pred),
                ref.mean(), 1e-6)
    w = np.linspace(0.0, 2.0, 32).astype(np.float32)
    check_close("GeodesicLoss with sample_weight", loss(y_true, y_pred, sample_weight=w),
                np.mean(w * ref), 1e-6)


def test_parameter_mse_loss():
    y_true, y_pred = random_params(16, 2), random_params(16, 3)
    std = [0.1, 0.2, 0.3, 0.1, 0.2, 0.3, 0.05, 0.05]
    mean = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    d = y_pred.astype(np.float64) - y_true
    check_close("ParameterMSELoss (no std)", losses.ParameterMSELoss()(y_true, y_pred),
                np.mean(d**2), 1e-6)
    check_close("ParameterMSELoss (std)", losses.ParameterMSELoss(mean, std).call(y_true, y_pred),
                np.mean((d / std) ** 2, axis=-1), 1e-5)
    with pytest.raises(ValueError, match="8 finite floats"):
        losses.ParameterMSELoss(std=[1.0] * 7)
    with pytest.raises(ValueError, match="> 0"):
        losses.ParameterMSELoss(std=[1.0] * 7 + [0.0])


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_projection_weight_is_validated(bad):
    with pytest.raises(ValueError, match="projection_weight must be a finite number >= 0"):
        losses.GeodesicLoss(projection_weight=bad)


# ----------------------------------------------------------------------------- serialization
@pytest.mark.filterwarnings("ignore:Skipping variable loading for optimizer")
def test_serialization_roundtrip(tmp_path):
    for loss in (losses.GeodesicLoss(0.5, name="geo"),
                 losses.ParameterMSELoss(std=[0.5] * 8, mean=[0.0] * 8)):
        assert keras.saving.get_registered_name(type(loss)).startswith("aetv2_tf>")
        clone = keras.losses.deserialize(keras.losses.serialize(loss))
        assert type(clone) is type(loss) and clone.get_config() == loss.get_config()
        assert type(loss).from_config(loss.get_config()).get_config() == loss.get_config()
        y_true, y_pred = random_params(4, 4), random_params(4, 5)
        np.testing.assert_allclose(clone(y_true, y_pred), loss(y_true, y_pred), rtol=1e-7)
    assert losses.GeodesicLoss(0.5).get_config()["projection_weight"] == 0.5

    inputs = keras.Input((8,))
    model = keras.Model(inputs, keras.layers.Dense(8)(inputs))
    model.compile(optimizer="adam", loss=losses.GeodesicLoss(0.25),
                  metrics=[losses.nonfinite_samples])
    model.save(tmp_path / "m.keras")
    restored = keras.models.load_model(tmp_path / "m.keras")
    assert isinstance(restored.loss, losses.GeodesicLoss)
    assert restored.loss.projection_weight == 0.25


# ----------------------------------------------------------------------------- mixed precision
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_computes_in_float32(policy, float32_policy_after):
    y_true, y_pred = random_params(16, 6), random_params(16, 7)
    reference = losses.GeodesicLoss()(y_true, y_pred)
    keras.mixed_precision.set_global_policy(policy)
    low = tf.cast(y_pred, keras.mixed_precision.dtype_policy().compute_dtype)  # a decoder output
    value, grad = loss_and_gradient(losses.GeodesicLoss(), y_true, low)
    assert low.dtype != tf.float32 and value.dtype == tf.float32
    assert np.all(np.isfinite(tf.cast(grad, tf.float32).numpy()))
    keras.mixed_precision.set_global_policy("float32")
    # Exactly the float32 loss of the rounded prediction, and close to the unrounded one.
    check_close(f"{policy}: loss vs float32 loss of the rounded y_pred", value,
                losses.GeodesicLoss()(y_true, tf.cast(low, tf.float32)), 1e-6)
    tol = 0.05 if policy == "mixed_bfloat16" else 5e-3
    check_close(f"{policy}: loss vs float32 loss", value, reference, tol)


# ----------------------------------------------------------------------------- non-finite guard
def test_one_nan_sample_contributes_zero_loss_and_zero_gradient():
    y_true, y_pred = random_params(8, 8), random_params(8, 9)
    bad_pred, bad_true = y_pred.copy(), y_true.copy()
    bad_pred[3, 2] = np.nan
    bad_true[5, 0] = np.inf
    keep = np.array([i not in (3, 5) for i in range(8)])
    loss = losses.GeodesicLoss()
    value, grad = loss_and_gradient(loss, bad_true, bad_pred)
    clean_value, clean_grad = loss_and_gradient(loss, y_true[keep], y_pred[keep])
    assert np.all(np.isfinite(grad.numpy()))
    # Mean over the full batch of 8 = (sum over the 6 good samples) / 8.
    check_close("NaN batch: loss * 8 vs clean loss * 6", value * 8, clean_value * 6, 1e-5)
    np.testing.assert_array_equal(grad.numpy()[~keep], 0.0)
    check_close("NaN batch: gradient of the good samples", grad.numpy()[keep] * 8,
                clean_grad.numpy() * 6, 2e-6)
    per_sample = loss.call(bad_true, bad_pred).numpy()
    np.testing.assert_array_equal(per_sample[~keep], 0.0)
    np.testing.assert_array_equal(losses.nonfinite_samples(bad_true, bad_pred), ~keep)


@pytest.mark.parametrize("name,y_true,y_pred", adversarial_pairs(),
                         ids=[x[0] for x in adversarial_pairs()])
def test_adversarial_inputs_give_finite_loss_and_gradient(name, y_true, y_pred):
    value, grad = loss_and_gradient(losses.GeodesicLoss(), y_true[None], y_pred[None])
    value, grad = float(value), grad.numpy()
    print(f"[info] {name}: loss {value:.4g}, max |grad| {np.abs(grad).max():.3g}")
    assert np.isfinite(value) and np.all(np.isfinite(grad))
    if name.startswith("t R90"):
        k = int(name[-1])
        np.testing.assert_allclose(value, [0, np.pi / 2, np.pi, np.pi / 2][k], atol=1e-5)
    if name == "singular y_true":  # the guard: dropped, loss 0, gradient 0
        assert value == 0.0 and not np.any(grad)
        assert float(losses.nonfinite_samples(y_true[None], y_pred[None])[0]) == 1.0


# ----------------------------------------------------------------------------- XLA, training
def test_loss_and_gradient_compile_with_xla():
    y_true = random_params(16, 11)
    y_pred = random_params(16, 12)
    y_pred[0] = np.nan
    y_pred[1] = y_true[1]
    loss = losses.GeodesicLoss()
    eager_value, eager_grad = loss_and_gradient(loss, y_true, y_pred)
    xla_value, xla_grad = tf.function(
        lambda a, b: loss_and_gradient(loss, a, b), jit_compile=True)(y_true, y_pred)
    check_close("GeodesicLoss XLA vs eager", xla_value, eager_value, 1e-6)
    check_close("GeodesicLoss gradient XLA vs eager", xla_grad, eager_grad, 1e-6)


def test_minimising_the_loss_recovers_the_homography():
    """Gradient descent on the 8 parameters alone converges to y_true (the optimum is T_hat = T,
    including a quarter turn, where the gradient must stay finite and useful)."""
    target = matrix_to_params(params_to_matrix(random_params(4, 13)) @ R90).numpy()
    y_pred = tf.Variable(np.tile(np.float32([1, 0, 0, 0, 1, 0, 0, 0]), (4, 1)))
    optimizer = keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.03, 200, 0.5))
    loss = losses.GeodesicLoss()

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            value = loss(target, y_pred)
        optimizer.apply_gradients([(tape.gradient(value, y_pred), y_pred)])
        return value

    first = float(step())
    for _ in range(800):
        last = float(step())
    print(f"[info] descent: loss {first:.3f} -> {last:.2e}, "
          f"param error {np.abs(y_pred.numpy() - target).max():.2e}")
    assert last < 1e-2 and np.abs(y_pred.numpy() - target).max() < 1e-2
