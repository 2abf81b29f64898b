"""Homographies as 3x3 matrices and the AETv2 geodesic distance on SO(3) (paper Sec. 4, Eq. 11).

Frames and directions follow `docs/conventions.md`: a homography ``T`` maps ORIGINAL to
TRANSFORMED homogeneous coordinates in the centred, normalised model frame, and its 8
parameters are the row-major entries of ``T / T[2, 2]`` without the last one.

The AETv2 loss between the applied ``T`` and the decoded ``T_hat`` is

    M     = normalize_determinant(T^{-1} T_hat)         # det M = +1 (real cube root)
    P     = project_to_so3(M) = U diag(1, 1, det(U V^T)) V^T,   M = U S V^T
    loss  = angle(P) + lambda * ||M - P||_F^2             # angle = arccos((tr P - 1) / 2)

Every function takes tensors with any leading (batch) dimensions, in float32 or float64, is
differentiable and XLA-compatible: cofactors instead of ``MatrixDeterminant``, a custom gradient
for the projection (docs/method.md section 3), ``atan2`` instead of ``acos``. Only ``keras.ops``:
TensorFlow or JAX tensors (under JAX, float64 needs ``jax_enable_x64``).
"""

from __future__ import annotations

import math

import numpy as np
from keras import ops
from keras.backend import standardize_dtype

from aetv2_tf.method.polar import adjugate_3x3, project_newton

__all__ = ["params_to_matrix", "matrix_to_params", "adjugate_3x3", "determinant_3x3",
           "inverse_3x3", "normalize_determinant", "PROJECTIONS", "project_to_so3",
           "rotation_angle", "relative_homography", "aetv2_components", "aetv2_distance",
           "AETV1_TARGET_MEAN", "AETV1_TARGET_STD", "aetv1_official_targets",
           "params_from_aetv1_official_targets"]


def _tensor(x, dtype=None):
    """`keras.ops.convert_to_tensor`, a `tf.Variable` read to its value first."""
    return ops.convert_to_tensor(x.read_value() if hasattr(x, "read_value") else x, dtype=dtype)


def _finfo(dtype) -> np.finfo:
    return np.finfo(standardize_dtype(dtype))


def params_to_matrix(p):
    """8 homography parameters ``(..., 8)`` -> matrices ``(..., 3, 3)`` with ``T[2, 2] = 1``.

    ``p = (T00, T01, T02, T10, T11, T12, T20, T21)``, row-major (conventions.md); same dtype.
    """
    p = _tensor(p)
    flat = ops.concatenate([p, ops.ones_like(p[..., :1])], axis=-1)
    return ops.reshape(flat, (*ops.shape(p)[:-1], 3, 3))


def matrix_to_params(m):
    """Matrices ``(..., 3, 3)`` -> 8 parameters ``(..., 8)`` of ``m / m[..., 2, 2]``."""
    m = _tensor(m)
    flat = ops.reshape(m, (*ops.shape(m)[:-2], 9))
    return flat[..., :8] / flat[..., 8:]


def determinant_3x3(m):
    """Determinant ``(...,)`` of ``(..., 3, 3)`` matrices by cofactor expansion (XLA-safe)."""
    return adjugate_3x3(_tensor(m))[1]


def inverse_3x3(m):
    """Inverse ``adj(m) / det(m)`` of ``(..., 3, 3)`` matrices (XLA-safe; inf/NaN if singular)."""
    adj, det = adjugate_3x3(_tensor(m))
    return adj / det[..., None, None]


def normalize_determinant(m, eps: float | None = None):
    """Scale ``(..., 3, 3)`` matrices to determinant +1: ``m / cbrt(det m)``, REAL cube root.

    ``cbrt(d) = sign(d) |d|^(1/3)`` (``-m`` is the same homography); invariant to any nonzero
    scale of ``m``. ``m`` is first divided by its largest absolute entry ``-> m_s``; the divisor
    ``|det m_s|^(1/3)`` is clamped below by ``eps`` (sign kept, + for 0; default: the cube root
    of the dtype's machine epsilon, 4.9e-3 in float32), so a numerically singular ``m`` gives
    ``m_s / eps`` with a finite gradient.
    """
    m = _tensor(m)
    info = _finfo(m.dtype)
    if eps is None:
        eps = float(info.eps) ** (1.0 / 3.0)
    scale = ops.maximum(ops.max(ops.abs(m), axis=(-2, -1), keepdims=True), float(info.tiny))
    m_s = m / scale
    det = determinant_3x3(m_s)
    abs_det = ops.abs(det)
    ones = ops.ones_like(abs_det)
    regular = abs_det > eps**3
    # "Double where": the power never sees 0, so its gradient stays finite in the clamped branch.
    root = ops.where(regular, ops.where(regular, abs_det, ones) ** (1.0 / 3.0), eps * ones)
    cbrt = ops.where(det < 0, -root, root)
    return m_s / cbrt[..., None, None]


def _transpose(m):
    return ops.swapaxes(m, -1, -2)


@ops.custom_gradient
def _project_to_so3(m):
    u, s, vh = ops.svd(m)  # m = u diag(s) vh, s descending, s >= 0 (vh = V^T)
    ones = ops.ones_like(s[..., 0])
    d = ops.where(determinant_3x3(u) * determinant_3x3(vh) < 0, -ones, ones)
    flip = ops.stack([ones, ones, d], axis=-1)  # diag(1, 1, d), d = sign det(U V^T)
    u1 = u * flip[..., None, :]  # U' = U D, so that P = U' V^T and M = U' diag(s') V^T
    s1 = s * flip  # s' = D s
    p = ops.matmul(u1, vh)
    info = _finfo(m.dtype)

    def grad(*args, upstream=None):
        g = args[0] if upstream is None else upstream
        # Polar-decomposition gradient (docs/method.md section 3): with B = U'^T G V,
        # dL/dM = U' [K o (B - B^T)] V^T, K_ij = 1 / (s'_i + s'_j) off the diagonal, 0 on it.
        b = ops.matmul(ops.matmul(_transpose(u1), g), _transpose(vh))
        denom = s1[..., :, None] + s1[..., None, :]
        # s'_i + s'_j ~ 0 only on the cut locus (d = -1 and s_2 = s_3, or rank <= 1), where P
        # jumps and the true gradient is unbounded: clamp |denominator| >= eps_machine * s_1.
        floor = ops.maximum(float(info.eps) * s[..., :1, None], float(info.tiny))
        safe = ops.where(ops.abs(denom) < floor, ops.where(denom < 0, -floor, floor), denom)
        off_diagonal = 1.0 - ops.eye(3, dtype=m.dtype)
        inner = off_diagonal / safe * (b - _transpose(b))
        return ops.matmul(ops.matmul(u1, inner), vh)

    return p, grad


#: The forwards of `project_to_so3`.
PROJECTIONS = ("svd", "newton")


def project_to_so3(m, method: str = "svd"):
    """Nearest rotation (Frobenius norm) ``P = U diag(1, 1, det(U V^T)) V^T`` of ``m = U S V^T``.

    Shapes ``(..., 3, 3) -> (..., 3, 3)``, same float dtype. The custom gradient is the polar
    decomposition's (denominators ``s'_i + s'_j``): exact at ``m = I`` and at rotations; on the
    cut locus (``s'_2 + s'_3 = 0``) the denominators are clamped to ``eps_machine * s_1``.
    ``method``: "svd" or "newton" (the same projection and gradient by `polar`'s iteration where
    the whole batch is in its range, else the SVD).
    """
    m = _tensor(m)
    if method == "svd":
        return _project_to_so3(m)
    if method == "newton":
        return project_newton(m, _project_to_so3)
    raise ValueError(f"method must be one of {PROJECTIONS}, got {method!r}")


def rotation_angle(r):
    """Geodesic angle ``theta in [0, pi]`` of rotation matrices ``(..., 3, 3) -> (...,)``.

    ``theta = atan2(||R - R^T||_F / (2 sqrt 2), (tr R - 1) / 2)``: the paper's
    ``arccos((tr R - 1) / 2)``, accurate near 0 and pi in float32; where ``R = R^T`` the norm's
    gradient is the zero subgradient, not NaN.
    """
    r = _tensor(r)
    sq = ops.sum(ops.square(r - _transpose(r)), axis=(-2, -1))
    nonzero = sq > 0
    norm = ops.where(nonzero, ops.sqrt(ops.where(nonzero, sq, ops.ones_like(sq))),
                     ops.zeros_like(sq))
    sin = norm / (2.0 * math.sqrt(2.0))
    cos = (r[..., 0, 0] + r[..., 1, 1] + r[..., 2, 2] - 1.0) / 2.0
    return ops.arctan2(sin, cos)


def _rank(x) -> int | None:
    rank = getattr(x.shape, "rank", -1)  # tf.TensorShape.rank (None: unknown); tuples: len
    return len(x.shape) if rank == -1 else rank


def _check_matrices(t, t_hat) -> tuple:
    t = _tensor(t)
    if ops.is_tensor(t_hat) and standardize_dtype(t_hat.dtype) != standardize_dtype(t.dtype):
        raise ValueError(f"t_hat must have the dtype of t ({standardize_dtype(t.dtype)}), got "
                         f"{standardize_dtype(t_hat.dtype)}")  # as tf.convert_to_tensor did
    t_hat = _tensor(t_hat, dtype=t.dtype)
    for name, x in (("t", t), ("t_hat", t_hat)):
        rank = _rank(x)
        if rank is not None and (rank < 2 or tuple(x.shape[-2:]) != (3, 3)):
            raise ValueError(
                f"{name} must be (..., 3, 3) matrices, got shape {x.shape}; "
                "convert 8 parameters with params_to_matrix first"
            )
    return t, t_hat


def relative_homography(t, t_hat, eps: float | None = None):
    """``M = normalize_determinant(T^{-1} T_hat)`` ``(..., 3, 3)``: ``I`` iff ``T_hat = T`` up to
    scale; ``t``, ``t_hat`` as in `aetv2_components`."""
    t, t_hat = _check_matrices(t, t_hat)
    return normalize_determinant(ops.matmul(inverse_3x3(t), t_hat), eps=eps)


def aetv2_components(t, t_hat, eps: float | None = None, projection: str = "svd") -> tuple:
    """The two terms of the AETv2 loss (Eq. 11): ``(angle, residual)``, each ``(...,)``.

    Args:
      t: applied homographies ``(..., 3, 3)`` (original -> transformed, model frame; any scale).
      t_hat: decoded homographies ``(..., 3, 3)``, same frame/direction, same float dtype.
      eps: singularity floor of `normalize_determinant` (default: dtype-dependent).
      projection: the ``method`` of `project_to_so3` ("svd" or "newton").

    Returns:
      ``angle``: geodesic distance ``theta(P)`` in radians, in ``[0, pi]``, with
      ``M = normalize_determinant(T^{-1} T_hat)`` and ``P = project_to_so3(M)``;
      ``residual``: the projection residual ``||M - P||_F^2 >= 0``.
    """
    m = relative_homography(t, t_hat, eps=eps)
    p = project_to_so3(m, projection)
    return rotation_angle(p), ops.sum(ops.square(m - p), axis=(-2, -1))


def aetv2_distance(t, t_hat, projection_weight: float = 1.0, eps: float | None = None,
                   projection: str = "svd"):
    """Per-sample AETv2 loss (Eq. 11) ``angle(P) + lambda ||M - P||_F^2``, shape ``(...,)``;
    arguments as `aetv2_components`, ``projection_weight`` the paper's ``lambda``."""
    angle, residual = aetv2_components(t, t_hat, eps=eps, projection=projection)
    return angle + projection_weight * residual


# The published AETv1 code (maple-research-lab/AET, cifar/v16_projective_uniform) regresses the 8
# coefficients of PIL's PERSPECTIVE map (output -> input, corner-origin pixels), normalised by:
AETV1_TARGET_MEAN = (0.0, 0.0, 16.0, 0.0, 0.0, 16.0, 0.0, 0.0)
AETV1_TARGET_STD = (1.0, 1.0, 20.0, 1.0, 1.0, 20.0, 0.015, 0.015)


def _corner_frame(size: int, dtype) -> tuple:
    """``N`` (PIL corner-origin pixel -> model frame, ``u = (x - W/2) / (W/2)``) and ``N^{-1}``,
    for a square ``size`` image; model coordinates are conventions.md's."""
    half = size / 2.0
    n = np.array([[1 / half, 0, -1], [0, 1 / half, -1], [0, 0, 1]])
    n_inv = np.array([[half, 0, half], [0, half, half], [0, 0, 1]])
    return ops.convert_to_tensor(n, dtype), ops.convert_to_tensor(n_inv, dtype)


def aetv1_official_targets(params, size: int = 32):
    """Model-frame parameters of ``T`` ``(..., 8)`` -> the published AETv1 code's normalised
    targets ``(..., 8)``: ``(c - AETV1_TARGET_MEAN) / AETV1_TARGET_STD``, where ``c`` are the 8
    row-major entries of ``G / G[2, 2]``, ``G = (N^{-1} T N)^{-1}`` the inverse (output -> input)
    map in PIL's corner-origin pixel coordinates of a ``size`` x ``size`` image (the inverse as
    the adjugate). The identity gives ``(1, 0, -0.8, 0, 1, -0.8, 0, 0)``.
    """
    t = params_to_matrix(params)
    n, n_inv = _corner_frame(size, t.dtype)
    g = adjugate_3x3(ops.matmul(ops.matmul(n_inv, t), n))[0]
    mean = ops.convert_to_tensor(np.array(AETV1_TARGET_MEAN), t.dtype)
    std = ops.convert_to_tensor(np.array(AETV1_TARGET_STD), t.dtype)
    return (matrix_to_params(g) - mean) / std


def params_from_aetv1_official_targets(targets, size: int = 32):
    """The inverse of `aetv1_official_targets`: normalised AETv1 targets ``(..., 8)`` ->
    model-frame parameters of ``T`` ``(..., 8)`` (``T = N adj(G) N^{-1}``, normalised)."""
    targets = _tensor(targets)
    mean = ops.convert_to_tensor(np.array(AETV1_TARGET_MEAN), targets.dtype)
    std = ops.convert_to_tensor(np.array(AETV1_TARGET_STD), targets.dtype)
    g = params_to_matrix(targets * std + mean)
    n, n_inv = _corner_frame(size, g.dtype)
    return matrix_to_params(ops.matmul(ops.matmul(n, adjugate_3x3(g)[0]), n_inv))
