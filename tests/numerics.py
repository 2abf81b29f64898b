"""Float64 oracles and comparisons shared by the tests of the mathematics: the measured-error
check, decoder outputs near the identity, the quarter turns, adversarial pairs, and the NumPy
oracle of every knob of `GeodesicLoss` with its finite-difference gradient."""

from __future__ import annotations

import numpy as np
import scipy.linalg
from scipy.spatial.transform import Rotation

R90 = np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
QUARTER_TURNS = [np.linalg.matrix_power(R90, k) for k in range(4)]  # I, R90, R180 (= pi), R270
#: The model-frame parameters (the 8 free entries of T, T22 = 1) of the identity and of R180.
IDENTITY = np.array([1, 0, 0, 0, 1, 0, 0, 0], np.float64)
R180 = np.array([-1, 0, 0, 0, -1, 0, 0, 0], np.float64)
#: The AETv1 parameters' standard deviations (the normalised MSE of `mse_weight`).
STD = np.array([0.71, 0.71, 0.115, 0.71, 0.71, 0.115, 0.083, 0.083])
PIXEL_FRAME = [[16.0, 0.0, 15.5], [0.0, 16.0, 15.5], [0.0, 0.0, 1.0]]  # N^{-1}, 32 x 32


def check_close(name, actual, expected, tol):
    """Assert max |actual - expected| <= tol and print it (the measured error table: run pytest
    with ``-s`` to see the ``[max-err]`` lines); returns the error."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (name, actual.shape, expected.shape)
    assert np.all(np.isfinite(actual)), f"{name}: non-finite values"
    err = float(np.max(np.abs(actual - expected)))
    print(f"[max-err] {name}: {err:.3e} (tol {tol:.0e})")
    assert err <= tol, f"{name}: max abs error {err:.3e} > {tol:.0e}"
    return err


def random_params(n, seed, spread=0.2):
    """``n`` float32 decoder outputs: the identity's parameters plus normal noise of ``spread``."""
    return (IDENTITY + spread * np.random.default_rng(seed).normal(size=(n, 8))).astype(np.float32)


def adversarial_pairs():
    """(name, y_true, y_pred) float32 parameter pairs that must give finite loss and gradient."""
    from aetv2_tf.method.geometry import matrix_to_params, params_to_matrix

    t = params_to_matrix(random_params(1, 10)).numpy()[0].astype(np.float64)
    p = matrix_to_params(t).numpy()
    mats = {f"t R90^{k}": t @ np.linalg.matrix_power(R90, k) for k in range(4)}
    mats["t Rx(pi) (det -1 after /T22)"] = t @ np.diag([1.0, -1.0, -1.0])
    mats["t flip (negative det)"] = t @ np.diag([1.0, -1.0, 1.0])
    rank2 = t.copy()
    rank2[1] = 2.0 * rank2[0]
    mats["exactly singular rank 2"] = rank2
    mats["near singular det 1e-7"] = t @ np.diag([1.0, 1e-7, 1.0])
    pairs = [(name, p, matrix_to_params(m).numpy()) for name, m in mats.items()]
    pairs += [
        ("all-zero params (rank 1)", p, np.zeros(8)),
        ("params 1e6", p, np.full(8, 1e6)),
        ("params 1e-6", p, np.full(8, 1e-6)),
        ("diag 1e6", p, np.array([1e6, 0, 0, 0, 1e6, 0, 0, 0])),
        ("diag 1e-6", p, np.array([1e-6, 0, 0, 0, 1e-6, 0, 0, 0])),
        ("projective 1e6", p, np.array([1, 0, 0, 0, 1, 0, 1e6, -1e6])),
        ("singular y_true", np.zeros(8), p),
    ]
    return [(n, np.float32(a), np.float32(b)) for n, a, b in pairs]


def np_variant_loss(p_true, p_pred, projection_weight=1.0, angle_power=1, residual_scale=0.0,
                    chordal_weight=0.0, mse_weight=0.0, mse_std=None, frame=None,
                    residual_frame="loss"):
    """Float64 oracle of every knob of `GeodesicLoss`, written from its docstring (numpy +
    scipy), per sample."""
    out = []
    f = np.eye(3) if frame is None else np.asarray(frame, np.float64)
    for a, b in zip(np.asarray(p_true, np.float64), np.asarray(p_pred, np.float64), strict=True):
        t, t_hat = (f @ np.append(x, 1.0).reshape(3, 3) @ np.linalg.inv(f) for x in (a, b))
        m = np.linalg.inv(t) @ t_hat
        m = m / np.cbrt(np.linalg.det(m))
        q = scipy.linalg.polar(m)[0]
        assert np.linalg.det(q) > 0  # inputs near the identity: no reflection to fix
        r = np.sum((m - q) ** 2)
        if residual_frame == "unit":  # the residual of M before the change of frame
            t_unit, t_hat_unit = (np.append(x, 1.0).reshape(3, 3) for x in (a, b))
            m_unit = np.linalg.inv(t_unit) @ t_hat_unit
            m_unit = m_unit / np.cbrt(np.linalg.det(m_unit))
            r = np.sum((m_unit - scipy.linalg.polar(m_unit)[0]) ** 2)
        if residual_scale:
            r = residual_scale * np.log1p(r / residual_scale)
        value = Rotation.from_matrix(q).magnitude() ** angle_power + projection_weight * r
        value += chordal_weight * np.sum((m - np.eye(3)) ** 2)
        std = np.ones(8) if mse_std is None else np.asarray(mse_std)
        value += mse_weight * np.mean(((b - a) / std) ** 2)
        out.append(value)
    return np.array(out)


#: The research knobs of `GeodesicLoss`, one setting each, and all at once.
VARIANTS = {
    "angle_squared": dict(angle_power=2),
    "residual_scale": dict(residual_scale=0.05),
    "chordal": dict(chordal_weight=0.5),
    "mse": dict(mse_weight=0.7, mse_std=STD),
    "pixel_frame": dict(frame=PIXEL_FRAME),
    # the default AETv2's: theta^2 at 4x and the unit-frame residual
    "unit_residual": dict(angle_power=2, frame=[[4.0, 0.0, 0.0], [0.0, 4.0, 0.0], [0.0, 0.0, 1.0]],
                          projection_weight=10.0, residual_frame="unit"),
    "all": dict(angle_power=2, residual_scale=0.1, chordal_weight=1.0, mse_weight=1.0,
                mse_std=STD, projection_weight=0.5),
}


def loss_and_gradients(loss, y_true: np.ndarray, y_pred: np.ndarray, oracle, h: float = 1e-6):
    """``(value, gradient, numeric)``: the float32 loss (reduction "sum") and its autodiff
    gradient at ``y_pred`` (B, 8), and the float64 central differences of ``sum(oracle(p))``."""
    import tensorflow as tf

    x = tf.constant(y_pred, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        value = loss(tf.constant(y_true, tf.float32), x)
    numeric = np.zeros_like(y_pred)
    for i in np.ndindex(y_pred.shape):
        e = np.zeros_like(y_pred)
        e[i] = h
        numeric[i] = (np.sum(oracle(y_pred + e)) - np.sum(oracle(y_pred - e))) / (2 * h)
    return float(value), tape.gradient(value, x).numpy(), numeric
