"""Keras losses and metrics of AETv2 (geodesic, Eq. 11) and of the AETv1 baseline (parameter MSE).

``y_true`` and ``y_pred`` are ``(batch, 8)`` homography parameters in the centred, normalised
model frame, ``T`` mapping original -> transformed coordinates (docs/conventions.md); the
decoder's 8 outputs are read as the row-major entries of ``T_hat`` with ``T_hat[2, 2] = 1``.

Everything is computed in float32, whatever the global dtype policy (``mixed_bfloat16`` casts
the decoder output up first). ``call`` returns per-sample losses ``(batch,)``; Keras reduces them
with ``sum_over_batch_size`` (sum / global batch size per replica under ``tf.distribute``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import keras
import tensorflow as tf

from aetv2_tf.geometry import (
    aetv2_components,
    inverse_3x3,
    normalize_determinant,
    params_to_matrix,
)

__all__ = [
    "GeodesicLoss",
    "ParameterMSELoss",
    "nonfinite_samples",
]

IDENTITY_PARAMS = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0)


def _as_float32_params(y_true, y_pred) -> tuple[tf.Tensor, tf.Tensor]:
    return tf.cast(y_true, tf.float32), tf.cast(y_pred, tf.float32)


def _finite_rows(x: tf.Tensor) -> tf.Tensor:
    return tf.reduce_all(tf.math.is_finite(x), axis=-1)


def _substitute(ok: tf.Tensor, y_true: tf.Tensor, y_pred: tf.Tensor):
    """Replace the samples where ``ok`` is False by the identity pair."""
    identity = tf.constant(IDENTITY_PARAMS, tf.float32)
    keep = ok[..., None]
    return tf.where(keep, y_true, identity), tf.where(keep, y_pred, identity)


def _evaluate(fn, y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    return fn(params_to_matrix(y_true), params_to_matrix(y_pred))


def _normalized_m(t: tf.Tensor, t_hat: tf.Tensor) -> tf.Tensor:
    """``M = normalize_determinant(T^{-1} T_hat)``, ``(..., 3, 3)``: the part before the SVD."""
    return normalize_determinant(tf.matmul(inverse_3x3(t), t_hat))


def _finite_samples(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    """Boolean ``(batch,)``: inputs finite and ``M`` finite (a forward pass without gradient).

    That is enough: a finite ``M`` has entries of at most ``1 / eps`` (the clamp of
    `normalize_determinant`), so its SVD, ``P``, the angle and the residual are finite too; and
    the SVD never sees a NaN (e.g. from a singular ``y_true``).
    """
    ok = _finite_rows(y_true) & _finite_rows(y_pred)
    m = tf.stop_gradient(_evaluate(_normalized_m, *_substitute(ok, y_true, y_pred)))
    return ok & tf.reduce_all(tf.math.is_finite(m), axis=[-2, -1])


def _guarded(
    fn: Callable[[tf.Tensor, tf.Tensor], tf.Tensor], y_true: tf.Tensor, y_pred: tf.Tensor
) -> tf.Tensor:
    """Per-sample ``fn(T, T_hat)`` that is 0, with a 0 gradient, for non-finite samples.

    "Double where": a sample whose ``y_true`` or ``y_pred`` has a NaN/inf entry, or whose ``M``
    is not finite (found by a cheap first pass without gradient), is replaced by the identity
    pair BEFORE the differentiated computation, so no NaN/inf reaches the backward pass; its
    output is then set to 0 (as is, as a last resort, any other non-finite output value). The
    other samples are untouched.
    """
    ok = _finite_samples(y_true, y_pred)
    value = _evaluate(fn, *_substitute(ok, y_true, y_pred))
    return tf.where(ok & tf.math.is_finite(value), value, tf.zeros_like(value))


def _aetv2_loss_fn(projection_weight: float):
    def loss(t, t_hat):
        angle, residual = aetv2_components(t, t_hat)
        return angle + projection_weight * residual

    return loss


def _check_projection_weight(projection_weight: float) -> float:
    w = float(projection_weight)
    if not (math.isfinite(w) and w >= 0.0):
        raise ValueError(
            f"projection_weight must be a finite number >= 0 (the paper's lambda, 1.0 in all its "
            f"experiments), got {projection_weight!r}; pass e.g. projection_weight=1.0"
        )
    return w


@keras.saving.register_keras_serializable(package="aetv2_tf")
class GeodesicLoss(keras.losses.Loss):
    """AETv2 loss (Eq. 11): geodesic angle on SO(3) + ``lambda`` x projection residual.

    Per sample, with ``T = params_to_matrix(y_true)`` and ``T_hat = params_to_matrix(y_pred)``:
    ``M = normalize_determinant(T^{-1} T_hat)``, ``P = project_to_so3(M)``,
    ``loss = angle(P) + projection_weight * ||M - P||_F^2`` (radians + squared Frobenius).

    Args:
      projection_weight: the paper's ``lambda >= 0`` (default 1.0, as in the paper).
      name, reduction: as `keras.losses.Loss` (default ``"sum_over_batch_size"``).

    Inputs ``(batch, 8)`` of any float dtype; computed in float32; ``call`` returns ``(batch,)``.

    Non-finite protection (explicit behaviour): a sample whose ``y_true``/``y_pred`` contains a
    NaN or inf, or whose loss is not finite, contributes loss 0 AND gradient 0 (its inputs are
    replaced by the identity before the computation, so no NaN leaks into the gradient of the
    others). The batch reduction still divides by the FULL batch size, so one bad sample among
    ``B`` scales the mean by ``(B - 1) / B`` instead of turning it into NaN. Use the
    `nonfinite_samples` metric to see how often that happens.

    Singular ``T_hat`` (``det ~ 0``, e.g. an all-zero decoder output): the determinant
    normalisation is clamped (see `geometry.normalize_determinant`), so the loss and its gradient
    stay finite; both are then large (loss up to ~4e5, gradient entries up to ~1e7 in float32 for
    a rank-1 ``T_hat``), pushing ``T_hat`` back to invertible matrices: initialise the decoder
    near the identity, not at 0.
    """

    def __init__(
        self,
        projection_weight: float = 1.0,
        name: str = "geodesic_loss",
        reduction: str | None = "sum_over_batch_size",
    ):
        super().__init__(name=name, reduction=reduction, dtype="float32")
        self.projection_weight = _check_projection_weight(projection_weight)

    def call(self, y_true, y_pred) -> tf.Tensor:
        y_true, y_pred = _as_float32_params(y_true, y_pred)
        return _guarded(_aetv2_loss_fn(self.projection_weight), y_true, y_pred)

    def get_config(self) -> dict:
        return {**super().get_config(), "projection_weight": self.projection_weight}


def _check_vector(name: str, values: Sequence[float] | None, positive: bool):
    if values is None:
        return None
    values = [float(v) for v in values]
    if len(values) != 8 or not all(math.isfinite(v) for v in values):
        raise ValueError(f"{name} must be 8 finite floats (one per homography parameter), "
                         f"got {values!r}; pass None for no normalisation")
    if positive and min(values) <= 0:
        raise ValueError(f"{name} must be > 0 for every parameter, got {values!r}")
    return values


@keras.saving.register_keras_serializable(package="aetv2_tf")
class ParameterMSELoss(keras.losses.Loss):
    """AETv1 baseline: per-sample mean over the 8 parameters of ``((y_pred - y_true) / std)^2``.

    The published AETv1 code regresses the 8 parameters, each normalised by a fixed mean and std,
    with an MSE (the paper's Eq. 1 writes ``1/2 ||T_hat - T||_F^2``). Subtracting ``mean`` from
    both sides cancels, so ``mean`` is only kept for the record (config); ``std`` (8 positive
    floats) rescales each parameter; ``None`` means 1. Inputs ``(batch, 8)``, computed in
    float32, ``call`` returns ``(batch,)``. No non-finite protection (plain MSE).
    """

    def __init__(
        self,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        name: str = "parameter_mse",
        reduction: str | None = "sum_over_batch_size",
    ):
        super().__init__(name=name, reduction=reduction, dtype="float32")
        self.mean = _check_vector("mean", mean, positive=False)
        self.std = _check_vector("std", std, positive=True)

    def call(self, y_true, y_pred) -> tf.Tensor:
        y_true, y_pred = _as_float32_params(y_true, y_pred)
        diff = y_pred - y_true
        if self.std is not None:
            diff = diff / tf.constant(self.std, tf.float32)
        return tf.reduce_mean(tf.square(diff), axis=-1)

    def get_config(self) -> dict:
        return {**super().get_config(), "mean": self.mean, "std": self.std}


@keras.saving.register_keras_serializable(package="aetv2_tf")
def nonfinite_samples(y_true, y_pred) -> tf.Tensor:
    """Metric: per-sample 1.0 where `GeodesicLoss` zeroes the sample out (non-finite), else 0.0.

    ``(batch, 8) x 2 -> (batch,)`` float32; its running mean is the fraction of dropped samples.
    (The two terms of the loss are logged by `aetv2_tf.metrics`.)
    """
    y_true, y_pred = _as_float32_params(y_true, y_pred)
    return 1.0 - tf.cast(_finite_samples(y_true, y_pred), tf.float32)
