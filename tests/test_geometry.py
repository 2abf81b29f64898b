"""aetv2_tf.method.geometry against independent float64 oracles (numpy, scipy) and finite
differences.

Every comparison goes through `check_close`, which prints ``[max-err] name: err (tol)``; run with
``-s`` to see the measured errors.
"""

import math

import numpy as np
import pytest
import scipy.linalg
import tensorflow as tf
from scipy.spatial.transform import Rotation

from aetv2_tf.method import geometry as g
from tests.numerics import QUARTER_TURNS, R90, check_close

RNG_SEED = 20200614


# ----------------------------------------------------------------------------- float64 oracles
def np_nearest_rotation(m):
    """Nearest rotation by scipy's polar decomposition, with the det(U V^T) = -1 fix."""
    q, h = scipy.linalg.polar(m)  # m = q h, q orthogonal, h symmetric PSD
    if np.linalg.det(q) < 0:  # flip the direction of the smallest singular value
        v = np.linalg.eigh(h)[1][:, 0]
        q = q @ (np.eye(3) - 2.0 * np.outer(v, v))
    return q


def np_angle(r):
    return Rotation.from_matrix(r).magnitude()


def np_components(t, t_hat):
    m = np.linalg.inv(t) @ t_hat
    m = m / np.cbrt(np.linalg.det(m))
    p = np_nearest_rotation(m)
    return np_angle(p), np.sum((m - p) ** 2)


def np_distance(t, t_hat, projection_weight=1.0):
    return np.array([a + projection_weight * r for a, r in map(np_components, t, t_hat)])


# ----------------------------------------------------------------------------- test data
def random_rotations(n, seed):
    return Rotation.random(n, random_state=seed).as_matrix()


def rotations_by_pi(n, seed):
    axes = np.random.default_rng(seed).normal(size=(n, 3))
    axes /= np.linalg.norm(axes, axis=1, keepdims=True)
    return 2.0 * axes[:, :, None] * axes[:, None, :] - np.eye(3)  # 2 n n^T - I


def random_homographies(n, seed, spread=0.25):
    """Well-conditioned homographies in the model frame (last entry 1)."""
    p = np.array([1, 0, 0, 0, 1, 0, 0, 0], np.float64)
    p = p + spread * np.random.default_rng(seed).normal(size=(n, 8))
    return g.params_to_matrix(p).numpy()


def projection_inputs(seed=RNG_SEED):
    """Random M (det > 0 and < 0, away from the cut locus), I, quarter turns, rotations, pi."""
    m = np.random.default_rng(seed).normal(size=(200, 3, 3))
    s = np.linalg.svd(m, compute_uv=False)
    m = m[(s[:, 1] - s[:, 2]) > 0.05 * s[:, 0]][:64]
    m = np.concatenate([m, QUARTER_TURNS, random_rotations(8, seed), rotations_by_pi(4, seed)])
    assert (np.linalg.det(m) < 0).sum() >= 20 and (np.linalg.det(m) > 0).sum() >= 20
    return m


def loss_inputs(seed=RNG_SEED):
    """(t, t_hat): random pairs, the optimum, quarter turns, pi, negative det, scaled t_hat."""
    t = random_homographies(48, seed)
    t_hat = random_homographies(48, seed + 1)
    t_hat[::4] = t_hat[::4] @ np.diag([1.0, -1.0, 1.0])  # negative determinants
    t_hat[1::4] *= -2.5  # same homography, other scale and det sign
    t_hat[:4] = t[:4] @ np.stack(QUARTER_TURNS)
    t_hat[4:8] = t[4:8] @ random_rotations(4, seed)
    return t, t_hat


def central_gradient(f, x, h=1e-6):
    """d sum(f(x)) / dx by central differences; f: (..., 3, 3) -> (...,), independent samples."""
    grad = np.zeros_like(x)
    for i in range(3):
        for j in range(3):
            e = np.zeros_like(x)
            e[..., i, j] = h
            grad[..., i, j] = (f(x + e) - f(x - e)) / (2 * h)
    return grad


def autodiff_gradient(f, x, dtype):
    x = tf.constant(x, dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(f(x))
    return tape.gradient(y, x).numpy()


# ----------------------------------------------------------------------------- basic algebra
@pytest.mark.parametrize("dtype,tol", [(tf.float64, 1e-12), (tf.float32, 2e-6)])
def test_params_roundtrip_and_layout(dtype, tol):
    p = np.random.default_rng(0).normal(size=(2, 5, 8))
    m = g.params_to_matrix(tf.constant(p, dtype))
    assert m.shape == (2, 5, 3, 3) and m.dtype == dtype
    np.testing.assert_array_equal(m.numpy()[..., 2, 2], 1.0)
    np.testing.assert_array_equal(m.numpy()[..., 0, 2], p[..., 2].astype(dtype.as_numpy_dtype))
    check_close(f"matrix_to_params(7 params_to_matrix) {dtype.name}",
                g.matrix_to_params(7.0 * m), p, tol)


@pytest.mark.parametrize("dtype,tol_det,tol_inv", [(tf.float64, 1e-13, 1e-12),
                                                   (tf.float32, 3e-6, 5e-5)])
def test_determinant_and_inverse_match_numpy(dtype, tol_det, tol_inv):
    m = np.random.default_rng(1).normal(size=(4, 32, 3, 3))
    m = m[np.linalg.cond(m) < 100][None]  # keep a leading batch dim
    m32 = m.astype(dtype.as_numpy_dtype).astype(np.float64)  # what the dtype can represent
    check_close(f"determinant_3x3 {dtype.name}", g.determinant_3x3(tf.constant(m, dtype)),
                np.linalg.det(m32), tol_det)
    check_close(f"inverse_3x3 {dtype.name}", g.inverse_3x3(tf.constant(m, dtype)),
                np.linalg.inv(m32), tol_inv)


@pytest.mark.parametrize("dtype,tol", [(tf.float64, 1e-12), (tf.float32, 5e-6)])
def test_normalize_determinant(dtype, tol):
    m = np.random.default_rng(2).normal(size=(64, 3, 3))
    m = m[np.linalg.cond(m) < 100]
    assert (np.linalg.det(m) < 0).any()
    ref = m / np.cbrt(np.linalg.det(m))[:, None, None]
    out = g.normalize_determinant(tf.constant(m, dtype))
    check_close(f"normalize_determinant {dtype.name}", out, ref, tol)
    np.testing.assert_allclose(g.determinant_3x3(out), 1.0, atol=10 * tol)
    for c in (-3.0, 1e6, 1e-6):  # projective: invariant to any nonzero scale
        check_close(f"normalize_determinant(c m), c={c:g} {dtype.name}",
                    g.normalize_determinant(tf.constant(c * m, dtype)), ref, tol)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_normalize_determinant_singular_is_finite(dtype):
    m = np.array([np.diag([0.0, 0.0, 1.0]), np.ones((3, 3)), np.diag([1.0, 1.0, 1e-30]),
                  np.diag([1.0, -1.0, 0.0]), np.zeros((3, 3))])
    out = g.normalize_determinant(tf.constant(m, dtype))
    eps = float(np.finfo(dtype.as_numpy_dtype).eps) ** (1 / 3)
    assert np.all(np.isfinite(out.numpy())) and np.abs(out.numpy()).max() <= 1.0001 / eps
    grad = autodiff_gradient(lambda x: tf.reduce_sum(g.normalize_determinant(x) ** 2, [-2, -1]),
                             m, dtype)
    assert np.all(np.isfinite(grad))


# ----------------------------------------------------------------------------- projection
@pytest.mark.parametrize("dtype,tol", [(tf.float64, 1e-12), (tf.float32, 5e-6)])
def test_project_to_so3_matches_polar(dtype, tol):
    m = projection_inputs()
    ref = np.stack([np_nearest_rotation(x) for x in m.astype(dtype.as_numpy_dtype)])
    p = g.project_to_so3(tf.constant(m.reshape(2, -1, 3, 3), dtype)).numpy().reshape(m.shape)
    check_close(f"project_to_so3 vs scipy polar {dtype.name}", p, ref, tol)
    check_close(f"project_to_so3 det = +1 {dtype.name}", np.linalg.det(p.astype(np.float64)),
                np.ones(len(m)), 10 * tol)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_project_to_so3_on_the_cut_locus(dtype):
    """s'_2 + s'_3 = 0 (e.g. -I): the nearest rotation is not unique; ours is one of them, and the
    clamped gradient is finite."""
    m = np.stack([-np.eye(3), np.diag([1.0, 1.0, -1.0]), np.diag([3.0, -2.0, 2.0]),
                  np.zeros((3, 3)), np.diag([1.0, 0.0, 0.0])])
    p = g.project_to_so3(tf.constant(m, dtype)).numpy().astype(np.float64)
    ref = np.stack([np_nearest_rotation(x) for x in m])
    check_close(f"cut locus: P^T P = I {dtype.name}", np.swapaxes(p, 1, 2) @ p,
                np.broadcast_to(np.eye(3), m.shape), 1e-5)
    check_close(f"cut locus: ||M - P|| minimal {dtype.name}", np.linalg.norm(m - p, axis=(1, 2)),
                np.linalg.norm(m - ref, axis=(1, 2)), 1e-5)
    grad = autodiff_gradient(lambda x: tf.reduce_sum(g.project_to_so3(x) ** 3, [-2, -1]), m, dtype)
    assert np.all(np.isfinite(grad))


@pytest.mark.parametrize("seed", [0, 1])
def test_project_to_so3_gradient_matches_finite_differences(seed):
    m = projection_inputs(seed)[:64]  # random M, both determinant signs
    w = np.random.default_rng(seed).normal(size=m.shape)  # upstream gradient G

    def f(x):
        return np.sum(w * np.stack([np_nearest_rotation(a) for a in x]), axis=(-2, -1))

    ours = autodiff_gradient(lambda x: tf.reduce_sum(w * g.project_to_so3(x), [-2, -1]),
                             m, tf.float64)
    scale = max(1.0, np.abs(ours).max())
    check_close(f"d project_to_so3 vs FD float64 (seed {seed})", ours / scale,
                central_gradient(f, m) / scale, 1e-7)


def naive_projection(m):
    """Plain autodiff through tf.linalg.svd: what the paper's "libraries automate" gives."""
    _, u, v = tf.linalg.svd(m)
    return tf.matmul(u, v, adjoint_b=True)


@pytest.mark.parametrize("dtype,tol", [(tf.float64, 1e-8), (tf.float32, 3e-6)])
def test_projection_gradient_at_identity_and_rotations(dtype, tol):
    """At M = I and exact rotations (where training converges) our gradient matches FD; the SVD
    autodiff gradient is silently zero there (and NaN with acos, see test_naive_loss_is_nan)."""
    m = np.stack([np.eye(3), *QUARTER_TURNS[1:], *random_rotations(4, 3), *rotations_by_pi(2, 4)])
    m = m.astype(dtype.as_numpy_dtype).astype(np.float64)
    w = np.random.default_rng(5).normal(size=m.shape)

    def f(x):  # float64 finite differences along the 9 basis directions E_ij
        return np.sum(w * np.stack([np_nearest_rotation(a) for a in x]), axis=(-2, -1))

    fd = central_gradient(f, m)
    ours = autodiff_gradient(lambda x: tf.reduce_sum(w * g.project_to_so3(x), [-2, -1]), m, dtype)
    check_close(f"d project_to_so3 at I/rotations vs FD {dtype.name}", ours, fd, tol)
    naive = autodiff_gradient(lambda x: tf.reduce_sum(w * naive_projection(x), [-2, -1]),
                              m, dtype)
    bad = ~np.isfinite(naive).all(axis=(-2, -1)) | (np.abs(naive - fd).max(axis=(-2, -1)) > 0.1)
    print(f"[info] naive SVD autodiff wrong/NaN on {bad.sum()}/{len(m)} samples "
          f"(max |err| {np.nanmax(np.abs(naive - fd)):.2f}, |FD| max {np.abs(fd).max():.2f})")
    assert bad.all()


# ----------------------------------------------------------------------------- rotation angle
@pytest.mark.parametrize("dtype,tol", [(tf.float64, 1e-12), (tf.float32, 2e-6)])
def test_rotation_angle_matches_scipy(dtype, tol):
    r = np.concatenate([random_rotations(64, 6), rotations_by_pi(8, 7), np.stack(QUARTER_TURNS)])
    r = r.astype(dtype.as_numpy_dtype).astype(np.float64)
    ref = np_angle(r)
    check_close(f"rotation_angle vs scipy magnitude {dtype.name}",
                g.rotation_angle(tf.constant(r, dtype)), ref, tol)


@pytest.mark.parametrize("theta", [1e-4, 1e-6, np.pi - 1e-4])
def test_rotation_angle_float32_accuracy_near_0_and_pi(theta):
    axis = np.array([1.0, -2.0, 0.5]) / np.linalg.norm([1.0, -2.0, 0.5])
    r = Rotation.from_rotvec(theta * axis).as_matrix()
    r32 = tf.constant(r, tf.float32)
    ours = float(g.rotation_angle(r32))
    naive = float(tf.acos((tf.linalg.trace(r32) - 1.0) / 2.0))  # the paper's formula, float32
    tol = 1e-5 * theta if theta < 1 else 1e-7 * theta  # relative near 0, ~1e-7 near pi
    check_close(f"rotation_angle float32 at theta={theta:.6g}", ours, theta, tol)
    print(f"[info] acos float32 at theta={theta:.6g}: error {abs(naive - theta):.3e}")
    assert abs(naive - theta) > 0.5 * min(theta, np.pi - theta)  # acos is useless there


def test_rotation_angle_gradient_matches_finite_differences():
    r = np.concatenate([random_rotations(32, 8), 1.1 * random_rotations(4, 9)])
    r = r[np.abs(np.sin(np_angle(r / np.cbrt(np.linalg.det(r))[:, None, None]))) > 0.1]
    ours = autodiff_gradient(g.rotation_angle, r, tf.float64)
    fd = central_gradient(lambda x: g.rotation_angle(tf.constant(x)).numpy(), r)
    check_close("d rotation_angle vs FD float64", ours, fd, 1e-8)
    for dtype in (tf.float32, tf.float64):  # the safe norm: zero subgradient at theta = 0 and pi
        grad = autodiff_gradient(g.rotation_angle, np.stack([np.eye(3), QUARTER_TURNS[2]]), dtype)
        np.testing.assert_array_equal(grad, 0.0)


# ----------------------------------------------------------------------------- AETv2 distance
@pytest.mark.parametrize("dtype,tol", [(tf.float64, 1e-10), (tf.float32, 1e-5)])
def test_aetv2_distance_matches_numpy(dtype, tol):
    t, t_hat = loss_inputs()
    t, t_hat = (x.astype(dtype.as_numpy_dtype).astype(np.float64) for x in (t, t_hat))
    ref_angle, ref_res = np.array([np_components(a, b) for a, b in zip(t, t_hat, strict=True)]).T
    angle, res = g.aetv2_components(tf.constant(t, dtype), tf.constant(t_hat, dtype))
    assert angle.dtype == dtype and angle.shape == (len(t),)
    check_close(f"aetv2 angle vs numpy {dtype.name}", angle, ref_angle, tol)
    check_close(f"aetv2 residual vs numpy {dtype.name}", res, ref_res, tol)
    check_close(f"aetv2_distance(lambda=0.5) vs numpy {dtype.name}",
                g.aetv2_distance(tf.constant(t, dtype), tf.constant(t_hat, dtype), 0.5),
                np_distance(t, t_hat, 0.5), tol)
    np.testing.assert_allclose(angle.numpy()[:4], [0, np.pi / 2, np.pi, np.pi / 2], atol=tol)
    np.testing.assert_allclose(res.numpy()[:8], 0.0, atol=tol)


def test_aetv2_distance_gradient_matches_finite_differences():
    t, t_hat = loss_inputs(11)
    t, t_hat = t[8:], t_hat[8:]  # away from the cones at angle 0 and pi
    for wrt in ("t_hat", "t"):
        if wrt == "t_hat":
            def f(x):
                return g.aetv2_distance(tf.constant(t), x)
            x0 = t_hat
        else:
            def f(x):
                return g.aetv2_distance(x, tf.constant(t_hat))
            x0 = t
        ours = autodiff_gradient(f, x0, tf.float64)
        fd = central_gradient(lambda x, f=f: f(tf.constant(x)).numpy(), x0)
        scale = max(1.0, np.abs(fd).max())
        check_close(f"d aetv2_distance/d {wrt} vs FD float64", ours / scale, fd / scale, 1e-7)


@pytest.mark.parametrize("dtype,tol", [(tf.float64, 1e-7), (tf.float32, 5e-6)])
def test_aetv2_distance_gradient_at_quarter_turns(dtype, tol):
    """t_hat = t R: the residual is 0 and P = R exactly; FD in float64 for angle pi/2."""
    t = random_homographies(6, 12).astype(dtype.as_numpy_dtype).astype(np.float64)
    t_hat = np.concatenate([t[:3] @ R90, t[3:] @ QUARTER_TURNS[3]])
    ours = autodiff_gradient(lambda x: g.aetv2_distance(tf.constant(t, dtype), x), t_hat, dtype)
    fd = central_gradient(lambda x: np_distance(t, x), t_hat)
    check_close(f"d aetv2_distance at t R90/R270 vs FD {dtype.name}", ours, fd, tol)
    for r in (QUARTER_TURNS[0], QUARTER_TURNS[2]):  # optimum and pi: cone apexes, finite only
        grad = autodiff_gradient(lambda x: g.aetv2_distance(tf.constant(t, dtype), x),
                                 t @ r, dtype)
        assert np.all(np.isfinite(grad)) and np.abs(grad).max() < 1e2


def test_naive_loss_is_nan_at_the_optimum():
    """The paper's loss with plain autodiff (SVD + acos) has a NaN gradient at t_hat = t."""
    t = tf.constant(random_homographies(4, 13), tf.float32)

    def naive_loss(t_hat):
        m = g.normalize_determinant(tf.matmul(g.inverse_3x3(t), t_hat))
        p = naive_projection(m)
        return tf.acos(tf.clip_by_value((tf.linalg.trace(p) - 1) / 2, -1, 1)) + tf.reduce_sum(
            (m - p) ** 2, [-2, -1])

    naive = autodiff_gradient(naive_loss, t.numpy(), tf.float32)
    ours = autodiff_gradient(lambda x: g.aetv2_distance(t, x), t.numpy(), tf.float32)
    print(f"[info] naive gradient at the optimum: finite={np.isfinite(naive).all()}")
    assert not np.isfinite(naive).all()
    assert np.isfinite(ours).all()


def test_shapes_and_bad_input():
    t = tf.eye(3, batch_shape=[2, 3])
    assert g.aetv2_distance(t, t).shape == (2, 3)
    assert g.rotation_angle(tf.eye(3)).shape == ()
    with pytest.raises(ValueError, match="params_to_matrix"):
        g.aetv2_distance(tf.zeros([4, 8]), tf.zeros([4, 8]))


def test_xla_compiles_distance_and_gradient():
    t, t_hat = (tf.constant(x, tf.float32) for x in loss_inputs(14))

    def step(t, t_hat):
        with tf.GradientTape() as tape:
            tape.watch(t_hat)
            loss = g.aetv2_distance(t, t_hat)
        return loss, tape.gradient(loss, t_hat)

    xla_loss, xla_grad = tf.function(step, jit_compile=True)(t, t_hat)
    loss, grad = step(t, t_hat)
    assert np.all(np.isfinite(xla_grad.numpy()))
    check_close("XLA vs eager aetv2_distance float32", xla_loss, loss, 1e-5)
    check_close("XLA vs eager gradient float32", xla_grad, grad, 1e-5)
    assert math.isfinite(float(tf.reduce_sum(xla_loss)))
