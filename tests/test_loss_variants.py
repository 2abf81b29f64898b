"""The research knobs of `GeodesicLoss` (docs/reproduction.md): each against a float64 NumPy
oracle, its gradient against central differences, and the behaviour at the cut locus theta = pi.
The paper's form (every knob off) is tested in test_losses.py."""

import numpy as np
import pytest
import tensorflow as tf

from aetv2_tf.method import losses
from tests.numerics import (
    IDENTITY,
    PIXEL_FRAME,
    R180,
    STD,
    VARIANTS,
    check_close,
    loss_and_gradients,
    np_variant_loss,
    random_params,
)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_matches_numpy(name):
    kwargs = VARIANTS[name]
    y_true, y_pred = random_params(16, 1, 0.1), random_params(16, 2, 0.1)
    loss = losses.GeodesicLoss(**kwargs, reduction=None)
    rel = np_variant_loss(y_true, y_pred, **kwargs)
    check_close(f"{name} (f32)", loss(y_true, y_pred), rel, 2e-5 * max(1.0, np.max(rel)))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_gradient_matches_finite_differences(name):
    kwargs = VARIANTS[name]
    y_true = random_params(4, 3, 0.1).astype(np.float64)
    y_pred = random_params(4, 4, 0.1).astype(np.float64)
    loss = losses.GeodesicLoss(**kwargs, reduction="sum")
    # The loss computes in float32; the gradient is checked against float64 differences of the
    # oracle, with a step and tolerance that float32 rounding allows.
    _, grad, numeric = loss_and_gradients(loss, y_true, y_pred,
                                          lambda p: np_variant_loss(y_true, p, **kwargs))
    check_close(f"{name} gradient", grad, numeric, 2e-3 * max(1.0, np.max(np.abs(numeric))))


def _gradient_at(kwargs, y_true, y_pred):
    x = tf.constant(y_pred[None], tf.float32)
    loss = losses.GeodesicLoss(**kwargs, reduction="sum")
    with tf.GradientTape() as tape:
        tape.watch(x)
        value = loss(tf.constant(y_true[None], tf.float32), x)
    return float(value), tape.gradient(value, x).numpy()[0]


def test_paper_form_has_no_gradient_at_pi_and_the_remedies_do():
    """A 180-degree pair decoded as the identity (the decoder's init): theta = pi exactly."""
    _, paper = _gradient_at({}, R180, IDENTITY)
    assert np.all(paper == 0.0), "the paper's form has no descent direction at the cut locus"
    for kwargs in (dict(chordal_weight=1.0), dict(mse_weight=1.0, mse_std=STD)):
        value, grad = _gradient_at(kwargs, R180, IDENTITY)
        assert np.all(np.isfinite(grad)) and np.linalg.norm(grad) > 0.1, kwargs
        stepped, _ = _gradient_at(kwargs, R180, IDENTITY - 1e-3 * grad)
        assert stepped < value - 1e-4, (kwargs, value, stepped)


def angle_after_steps(kwargs, y_true, y_pred, steps=200, lr=1e-2):
    """Plain gradient descent on T_hat from y_pred; returns the final geodesic angle (deg)."""
    x = tf.Variable(y_pred[None], dtype=tf.float32)
    loss = losses.GeodesicLoss(**kwargs, reduction="sum")

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            value = loss(tf.constant(y_true[None], tf.float32), x)
        x.assign_sub(lr * tape.gradient(value, x))

    for _ in range(steps):
        step()
    from aetv2_tf.method.metrics import geodesic_angle_deg
    return float(geodesic_angle_deg(tf.constant(y_true[None], tf.float32), x)[0])


def test_near_pi_gradient_lowers_the_angle():
    """Just off the cut locus (a 179-degree error), descent turns T_hat towards T."""
    c, s = np.cos(np.radians(179.0)), np.sin(np.radians(179.0))
    y_true = np.array([c, -s, 0, s, c, 0, 0, 0], np.float64)
    for kwargs in ({}, dict(angle_power=2), dict(chordal_weight=1.0)):
        assert angle_after_steps(kwargs, y_true, IDENTITY) < 170.0, kwargs


@pytest.mark.parametrize("bad", [
    dict(angle_power=3), dict(residual_scale=-1.0), dict(chordal_weight=float("nan")),
    dict(mse_weight=-0.1), dict(mse_std=[1.0] * 7), dict(frame=[[1, 0], [0, 1]]),
    dict(frame=np.zeros((3, 3)).tolist())])
def test_bad_knobs_are_refused(bad):
    with pytest.raises(ValueError):
        losses.GeodesicLoss(**bad)


def test_knobs_survive_serialization():
    loss = losses.GeodesicLoss(**VARIANTS["all"], frame=PIXEL_FRAME)
    again = losses.GeodesicLoss.from_config(loss.get_config())
    y_true, y_pred = random_params(8, 5, 0.1), random_params(8, 6, 0.1)
    np.testing.assert_allclose(again(y_true, y_pred), loss(y_true, y_pred), rtol=1e-6)


def test_mse_warm_up_decays_to_the_geodesic_loss():
    y_true, y_pred = random_params(8, 7, 0.1), random_params(8, 8, 0.1)
    loss = losses.GeodesicLoss(mse_weight=2.0, mse_std=STD, mse_decay_steps=100, reduction=None)
    with pytest.raises(ValueError, match="loss.step"):
        loss(y_true, y_pred)
    step = tf.Variable(0, dtype=tf.int64)
    loss.step = step
    for at, weight in ((0, 2.0), (50, 1.0), (100, 0.0), (1000, 0.0)):
        step.assign(at)
        expected = np_variant_loss(y_true, y_pred, mse_weight=weight, mse_std=STD)
        check_close(f"warm-up at step {at}", loss(y_true, y_pred), expected, 2e-5)
    with pytest.raises(ValueError, match="mse_decay_steps"):
        losses.GeodesicLoss(mse_decay_steps=-1)


def test_decoder_can_start_at_a_rotation():
    from aetv2_tf.models import build_aet_model, build_backbone, identity_params

    np.testing.assert_allclose(identity_params(8, 90.0), [0, -1, 0, 1, 0, 0, 0, 0], atol=1e-7)
    model = build_aet_model(build_backbone("nin", (32, 32, 3)), init_rotation_deg=45.0)
    c = np.sqrt(0.5)
    np.testing.assert_allclose(model.get_layer("decoder").bias.numpy(),
                               [c, -c, 0, c, c, 0, 0, 0], atol=1e-6)
