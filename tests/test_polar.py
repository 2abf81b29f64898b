"""The SVD-free nearest rotation (`geometry.project_to_so3(m, method="newton")`, `polar`)
against float64 `scipy.linalg.polar`, its gradient against the SVD path's and against finite
differences, its range and its fall-back, and the AETv2 loss through it against the SVD path,
on TensorFlow and under Keras-on-JAX (`jax.jit`, a child process). Run with ``-s`` to see the
measured errors.

Measured (float32; the largest entry error of ``P`` against float64 ``scipy.linalg.polar``):
1e-7 to 4e-7 for ``kappa_2 <= 60`` (the SVD path: 3e-7 to 4.6e-6), 9e-7 at ``kappa_2 = 100``,
7e-6 at 1,000, 7e-5 at 10,000, failure (error ~2) at 1e6; ``in_range`` is exactly ``kappa_F <=
200`` (``kappa_F = ||M||_F ||M^{-1}||_F``, between ``kappa_2`` and ``sqrt(3) kappa_2`` here),
where the error stays below 1.5e-6. The float32 gradient is within 1.7e-6 of the float64 one
(the SVD path's: 1.6e-5), and the float64 gradient within 1.1e-8 of central differences of
``scipy.linalg.polar``. The AETv2 loss: values within 1e-6, gradients within 2.3e-6 of the SVD
path's (relative to the largest entry).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import scipy.linalg
import tensorflow as tf
from scipy.spatial.transform import Rotation

from aetv2_tf.method import geometry, losses, polar
from tests.cli import REPO, _env
from tests.numerics import adversarial_pairs


def with_singular_values(s: np.ndarray, seed: int) -> np.ndarray:
    """``R1 diag(s) R2`` ``(N, 3, 3)`` float64 for random rotations R1, R2 (``s``: ``(N, 3)``)."""
    r1 = Rotation.random(len(s), random_state=seed).as_matrix()
    r2 = Rotation.random(len(s), random_state=seed + 1).as_matrix()
    return r1 @ (s[:, :, None] * r2)


def conditioned(kappa: float, n: int = 300, seed: int = 0) -> np.ndarray:
    """``det = +1`` matrices with ``s_1 / s_3 = kappa`` (``s_2`` log-uniform between)."""
    rng = np.random.default_rng(seed)
    s = np.stack([np.ones(n), np.exp(rng.uniform(0, np.log(kappa), n)), np.full(n, kappa)], -1)
    return with_singular_values(s / np.prod(s, -1, keepdims=True) ** (1 / 3), seed)


def condition_f(m: np.ndarray) -> np.ndarray:
    """``kappa_F = ||M||_F ||M^{-1}||_F`` in float64."""
    return np.linalg.norm(m, axis=(-2, -1)) * np.linalg.norm(np.linalg.inv(m), axis=(-2, -1))


def reference(m: np.ndarray) -> np.ndarray:
    return np.stack([scipy.linalg.polar(x)[0] for x in np.asarray(m, np.float64)])


def newton(m, dtype=tf.float32) -> tuple[np.ndarray, np.ndarray]:
    p, ok = polar.newton_polar(tf.constant(m, dtype))
    return p.numpy(), ok.numpy()


def families() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    near_identity = np.eye(3) + 1e-4 * rng.standard_normal((200, 3, 3))
    axes = rng.standard_normal((200, 3))
    axes /= np.linalg.norm(axes, axis=-1, keepdims=True)
    half_turns = Rotation.from_rotvec(axes * (np.pi - 1e-3 * rng.random((200, 1)))).as_matrix()
    near_half_turns = half_turns + 1e-3 * rng.standard_normal((200, 3, 3))
    random = rng.standard_normal((2000, 3, 3))
    random *= np.sign(np.linalg.det(random))[:, None, None]
    random = random[condition_f(random) <= 100.0][:200]  # (the range: `test_..._range_...`)
    return {"random (det > 0)": random, "near identity": near_identity,
            "exact half turns": half_turns, "near half turns": near_half_turns,
            "kappa 10": conditioned(10.0), "kappa 60": conditioned(60.0)}


@pytest.mark.parametrize("name", list(families()))
def test_newton_matches_float64_polar_in_range(name):
    m = families()[name]
    want = reference(m)
    got, ok = newton(m)
    svd = geometry.project_to_so3(tf.constant(m, tf.float32)).numpy()
    error, svd_error = np.abs(got - want).max(), np.abs(svd - want).max()
    print(f"[info] {name}: newton {error:.2e}, svd {svd_error:.2e}")
    assert ok.all()
    assert error <= 1.5e-6
    got64, ok64 = newton(m, tf.float64)
    assert ok64.all() and np.abs(got64 - want).max() <= 1e-12


@pytest.mark.parametrize("kappa,inside,tolerance", [(100.0, None, 1.5e-6),
                                                     (1e3, False, 2e-5),
                                                     (1e4, False, 2e-4),
                                                     (1e6, False, None)])
def test_newton_error_grows_with_the_condition_number_and_the_range_stops_it(kappa, inside,
                                                                          tolerance):
    """Where the error passes 1.5e-6 the matrices are out of range (``kappa_F > 200``); at
    ``kappa_2 = 100`` all are in range (``kappa_F`` from 100 to 142), all accurate."""
    m = conditioned(kappa)
    got, ok = newton(m)
    errors = np.abs(got - reference(m)).max(axis=(-2, -1))
    print(f"[info] kappa {kappa:.0e}: in range {ok.mean():.2f}, largest error "
          f"{np.nanmax(errors):.2e}")
    np.testing.assert_array_equal(ok, condition_f(m) <= polar.MAX_CONDITION)
    if inside is not None:
        assert not ok.any()
    assert np.all(errors[ok] <= 1.5e-6)
    if tolerance is not None:
        assert np.nanmax(errors) <= tolerance


def test_out_of_range_batches_take_the_svd():
    """A negative determinant (the SVD path's ``d = -1``: a rotation, not the orthogonal polar
    factor), a singular or an ill-conditioned matrix: the whole batch takes the SVD."""
    good = families()["random (det > 0)"][:6]
    for bad in (np.diag([1.0, 1.0, -1.0]), np.diag([1.0, 1.0, 0.0]),
                conditioned(1e5, n=1)[0], np.full((3, 3), np.nan)):
        batch = tf.constant(np.concatenate([good, bad[None]]), tf.float32)
        assert not newton(batch)[1][-1] and newton(batch)[1][:-1].all()
        got = geometry.project_to_so3(batch, "newton").numpy()
        np.testing.assert_array_equal(got, geometry.project_to_so3(batch).numpy())
    with pytest.raises(ValueError, match="newton"):
        geometry.project_to_so3(batch, "qr")


def gradient(m, upstream, method: str, dtype=tf.float32) -> np.ndarray:
    x = tf.constant(m, dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        value = tf.reduce_sum(geometry.project_to_so3(x, method) * tf.constant(upstream, dtype))
    return tape.gradient(value, x).numpy()


def test_gradient_equals_the_svd_paths_and_finite_differences():
    rng = np.random.default_rng(7)
    m = np.concatenate([families()[k][:20] for k in families()])
    m = np.asarray(geometry.normalize_determinant(tf.constant(m, tf.float64)))
    assert newton(m)[1].all()  # the Newton branch, not the fall-back
    upstream = rng.standard_normal(m.shape)
    got = gradient(m, upstream, "newton", tf.float64)
    scale = np.abs(got).max(axis=(-2, -1), keepdims=True)
    newton32, svd32 = (np.max(np.abs(gradient(m, upstream, k) - got) / scale) for k in
                       ("newton", "svd"))
    print(f"[info] float32 gradients vs float64: newton {newton32:.2e}, svd {svd32:.2e}")
    assert newton32 <= 1e-5 and newton32 <= 2 * svd32
    step, numeric = 1e-6, np.zeros_like(m)
    for i in range(3):
        for j in range(3):
            d = np.zeros_like(m)
            d[:, i, j] = step
            numeric[:, i, j] = np.sum((reference(m + d) - reference(m - d)) * upstream,
                                      axis=(-2, -1)) / (2 * step)
    error = np.max(np.abs(got - numeric) / np.abs(numeric).max(axis=(-2, -1), keepdims=True))
    print(f"[info] gradient vs finite differences (float64): {error:.2e}")
    assert error <= 1e-7


def projection_loss_and_gradient(loss, y_true, y_pred):
    y_pred = tf.constant(y_pred)
    with tf.GradientTape() as tape:
        tape.watch(y_pred)
        value = loss(tf.constant(y_true), y_pred)
    return float(value), tape.gradient(value, y_pred).numpy()


@pytest.mark.parametrize("config", [{}, {"angle_power": 2, "frame": np.diag([4.0, 4.0, 1.0]),
                                          "residual_frame": "unit", "projection_weight": 10.0}],
                         ids=["paper", "aetv2-default"])
def test_geodesic_loss_through_newton_equals_the_svd_path(config):
    """The loss (angle and residual) and its gradient w.r.t. the decoded parameters, on a batch
    of sampler-like pairs with predictions at every distance, and the rotation angle of P."""
    rng = np.random.default_rng(11)
    y_true = np.float32(np.array([1, 0, 0, 0, 1, 0, 0, 0]) + 0.1 * rng.standard_normal((64, 8)))
    y_true[:, 6:] *= 0.1
    y_pred = np.float32(y_true + rng.standard_normal((64, 8)) * rng.choice([1e-4, 0.05, 0.5],
                                                                           (64, 1)))
    svd = projection_loss_and_gradient(losses.GeodesicLoss(**config), y_true, y_pred)
    new = projection_loss_and_gradient(losses.GeodesicLoss(**config, projection="newton"),
                                       y_true, y_pred)
    print(f"[info] loss {svd[0]:.6f} vs {new[0]:.6f}; gradient "
          f"{np.abs(svd[1] - new[1]).max() / np.abs(svd[1]).max():.2e}")
    assert abs(svd[0] - new[0]) <= 1e-6 * max(1.0, abs(svd[0]))
    assert np.abs(svd[1] - new[1]).max() <= 1e-4 * np.abs(svd[1]).max()
    m = geometry.relative_homography(geometry.params_to_matrix(y_true),
                                     geometry.params_to_matrix(y_pred))
    angles = [geometry.rotation_angle(geometry.project_to_so3(m, k)).numpy()
              for k in geometry.PROJECTIONS]
    assert np.abs(angles[0] - angles[1]).max() <= 2e-6
    assert losses.GeodesicLoss(projection="newton").get_config()["projection"] == "newton"
    with pytest.raises(ValueError, match="projection"):
        losses.GeodesicLoss(projection="qr")


def test_adversarial_pairs_give_the_svd_paths_loss():
    """The adversarial pairs of tests/test_losses.py, one batch: the fall-back gives the SVD
    path's finite loss and gradient."""
    pairs = adversarial_pairs()
    y_true = np.stack([p[1] for p in pairs])
    y_pred = np.stack([p[2] for p in pairs])
    svd = projection_loss_and_gradient(losses.GeodesicLoss(), y_true, y_pred)
    new = projection_loss_and_gradient(losses.GeodesicLoss(projection="newton"), y_true, y_pred)
    assert np.isfinite(new[0]) and np.all(np.isfinite(new[1]))
    assert svd[0] == new[0]
    np.testing.assert_array_equal(svd[1], new[1])


JAX_CASE = """
import sys; sys.modules['tensorflow'] = None
import jax, numpy as np, keras
from aetv2_tf.method import losses
rng = np.random.default_rng(3)
y_true = np.float32(np.array([1, 0, 0, 0, 1, 0, 0, 0]) + 0.1 * rng.standard_normal((32, 8)))
y_true[:, 6:] *= 0.1
y_pred = np.float32(y_true + 0.05 * rng.standard_normal((32, 8)))
bad = y_pred.copy(); bad[0] = [1, 0, 0, 0, 1, 0, 0, 0]; bad[0, :3] *= 1e4  # kappa ~ 1e4
assert not np.all(np.asarray(__import__('aetv2_tf.method.polar').method.polar.newton_polar(
    losses.relative_homography(losses.params_to_matrix(y_true),
                               losses.params_to_matrix(bad)))[1]))
out = []
for pred in (y_pred, bad):
    for projection in ("svd", "newton"):
        loss = losses.GeodesicLoss(angle_power=2, projection_weight=10.0, projection=projection)
        value, grad = jax.jit(jax.value_and_grad(lambda p: loss(y_true, p)))(pred)
        out.append((float(value), np.asarray(grad)))
for i in (0, 2):
    (a, ga), (b, gb) = out[i], out[i + 1]
    print("RESULT", abs(a - b) / max(1.0, abs(a)), np.abs(ga - gb).max() / np.abs(ga).max())
"""


@pytest.mark.slow
def test_newton_under_jax_jit():
    """Keras on JAX, inside `jax.jit` (`lax.cond` picks the branch): the same loss and
    gradient as the SVD path, in range and for a batch that falls back."""
    proc = subprocess.run([sys.executable, "-c", JAX_CASE], cwd=REPO, capture_output=True,
                          text=True, env=_env({"KERAS_BACKEND": "jax"}), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    (loss_in, grad_in), (loss_out, grad_out) = [[float(v) for v in r] for r in results]
    print(f"[info] jax: in range {loss_in:.1e} / {grad_in:.1e}, fallback {loss_out} / {grad_out}")
    assert loss_in <= 1e-6 and grad_in <= 1e-4
    assert loss_out <= 1e-7 and grad_out <= 1e-6  # the SVD in another compiled program
