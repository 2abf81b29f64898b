"""The nearest rotation of 3x3 matrices without an SVD: a scaled Newton iteration for the
orthogonal polar factor (`geometry.project_to_so3(m, method="newton")`), and the 3x3 cofactors
it and `geometry` are written with (`adjugate_3x3`, re-exported by `geometry`).

For ``M = U S V^T`` with ``det M > 0`` the orthogonal polar factor ``P = U V^T`` is a rotation
and equals the SVD projection of `geometry.project_to_so3` (the AETv2 loss normalises
``det M = +1`` first, `geometry.normalize_determinant`). Newton's iteration with Frobenius-norm
scaling (Higham, *Functions of Matrices*, Sec. 8.6)::

    X_0 = M,   X_{k+1} = (zeta_k X_k + X_k^{-T} / zeta_k) / 2,
    zeta_k = (||X_k^{-1}||_F / ||X_k||_F)^(1/2)

keeps ``U`` and ``V`` and maps every singular value ``s -> (zeta s + 1 / (zeta s)) / 2``, which
converges quadratically to 1; ``X^{-T}`` is the transposed adjugate over the determinant
(`adjugate_3x3`: cofactors, no LAPACK call, elementwise work on the batch).

Range: in float32 the error grows as ``kappa * eps`` (measured against float64
``scipy.linalg.polar``, tests/test_polar.py: <= 4e-7 for ``kappa_2 <= 60``, 7e-6 at 1,000). The
iteration is used only where ``kappa_F = ||M||_F ||M^{-1}||_F <= MAX_CONDITION``, ``det M > 0``
and the last step is below ``MAX_LAST_STEP``; otherwise the WHOLE batch takes the SVD
(`keras.ops.cond`). Training stays inside (``kappa_2 <= 52`` over 20,000 sampler draws).

Gradient: the polar decomposition's, as the SVD path's (docs/method.md, section 3), written
without the SVD: with ``H = P^T M`` (symmetric positive definite) and the upstream ``G``,
``dL/dM = P [w]_x``, ``w = (tr(H) I - H)^{-1} c``, ``[c]_x = P^T G - G^T P`` (``[v]_x`` the
cross-product matrix; ``H [w]_x + [w]_x H = [(tr(H) I - H) w]_x`` for symmetric ``H``). The
eigenvalues of ``tr(H) I - H`` are the sums ``s_i + s_j``: the SVD path's denominators.
"""

from __future__ import annotations

from keras import ops

__all__ = ["ITERATIONS", "MAX_CONDITION", "MAX_LAST_STEP", "adjugate_3x3", "newton_polar",
           "project_newton"]

#: Newton steps: 5 reach float32's floor at kappa_2 = 100, 6 at 1,000 (tests/test_polar.py).
ITERATIONS = 6
#: The largest ``kappa_F = ||M||_F ||M^{-1}||_F`` the iteration is used for (error <= 1e-6).
MAX_CONDITION = 200.0
#: The largest Frobenius norm of the last Newton step of a converged iteration.
MAX_LAST_STEP = 1e-3


def _transpose(m):
    return ops.swapaxes(m, -1, -2)


def _entries(m) -> list:
    return [m[..., i, j] for i in range(3) for j in range(3)]


def adjugate_3x3(m) -> tuple:
    """Adjugate (transposed cofactor matrix) ``(..., 3, 3)`` and determinant ``(...,)``."""
    a, b, c, d, e, f, g, h, i = _entries(m)
    rows = [
        [e * i - f * h, c * h - b * i, b * f - c * e],
        [f * g - d * i, a * i - c * g, c * d - a * f],
        [d * h - e * g, b * g - a * h, a * e - b * d],
    ]
    adj = ops.stack([ops.stack(r, axis=-1) for r in rows], axis=-2)
    det = a * rows[0][0] + b * rows[1][0] + c * rows[2][0]
    return adj, det


def newton_polar(m, iterations: int = ITERATIONS) -> tuple:
    """Scaled Newton iteration on ``m`` ``(..., 3, 3)``: ``(P, in_range)``, ``P`` the polar
    factor (meaningful only where ``in_range`` ``(...,)``: ``det m > 0``, ``kappa_F(m) <=
    MAX_CONDITION``, last step <= MAX_LAST_STEP, finite); no gradient (`project_newton`)."""
    x = m
    condition = det = step = None
    for k in range(iterations):
        adj, d = adjugate_3x3(x)
        inverse_t = _transpose(adj) / d[..., None, None]
        norm_x = ops.sum(ops.square(x), axis=(-2, -1))
        norm_inverse = ops.sum(ops.square(inverse_t), axis=(-2, -1))
        if k == 0:
            det, condition = d, ops.sqrt(norm_x * norm_inverse)
        zeta = ops.sqrt(ops.sqrt(norm_inverse / norm_x))[..., None, None]
        new = 0.5 * (zeta * x + inverse_t / zeta)
        step = ops.sqrt(ops.sum(ops.square(new - x), axis=(-2, -1)))
        x = new
    in_range = (det > 0) & (condition <= MAX_CONDITION) & (step <= MAX_LAST_STEP)
    return x, in_range & ops.all(ops.isfinite(x), axis=(-2, -1))


@ops.custom_gradient
def _with_polar_gradient(m, p):
    """``p`` (the polar factor of ``m``, computed outside) with the polar gradient w.r.t. ``m``
    (module docstring) and none w.r.t. ``p``."""

    def grad(*args, upstream=None):
        g = args[0] if upstream is None else upstream
        h = ops.matmul(_transpose(p), m)
        h = 0.5 * (h + _transpose(h))
        c = ops.matmul(_transpose(p), g)
        c = c - _transpose(c)  # [c]_x = P^T G - G^T P
        c = ops.stack([c[..., 2, 1], c[..., 0, 2], c[..., 1, 0]], axis=-1)
        trace = h[..., 0, 0] + h[..., 1, 1] + h[..., 2, 2]
        a = trace[..., None, None] * ops.eye(3, dtype=m.dtype) - h
        adj, det = adjugate_3x3(a)
        w = ops.matmul(adj, c[..., None])[..., 0] / det[..., None]
        zero = ops.zeros_like(w[..., 0])
        w1, w2, w3 = w[..., 0], w[..., 1], w[..., 2]
        cross = ops.stack([ops.stack([zero, -w3, w2], axis=-1),
                           ops.stack([w3, zero, -w1], axis=-1),
                           ops.stack([-w2, w1, zero], axis=-1)], axis=-2)
        return ops.matmul(p, cross), ops.zeros_like(p)

    return p, grad


def project_newton(m, svd_projection, iterations: int = ITERATIONS):
    """The nearest rotation of ``m`` ``(..., 3, 3)`` by the Newton iteration with the polar
    gradient, where EVERY matrix of the batch is in range (`newton_polar`); else
    ``svd_projection(m)`` for the whole batch (`keras.ops.cond`, one branch runs)."""
    p, in_range = newton_polar(m, iterations)
    p = ops.stop_gradient(p)
    return ops.cond(ops.all(in_range), lambda: _with_polar_gradient(m, p),
                    lambda: svd_projection(m))
