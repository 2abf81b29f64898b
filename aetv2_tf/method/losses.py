"""Keras losses and metrics of AETv2 (geodesic, Eq. 11) and of the AETv1 baseline (parameter MSE).

``y_true`` and ``y_pred`` are ``(batch, 8)`` homography parameters in the model frame, ``T``
mapping original -> transformed coordinates (docs/conventions.md), ``T[2, 2] = 1``. Computed in
float32 whatever the dtype policy; ``call`` returns per-sample losses ``(batch,)`` (Keras reduces
with ``sum_over_batch_size``). Only ``keras.ops`` (TensorFlow or JAX).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from typing import Any

import keras
import numpy as np
from keras import ops

from aetv2_tf.method.geometry import (
    PROJECTIONS,
    aetv1_official_targets,
    matrix_to_params,
    params_to_matrix,
    project_to_so3,
    relative_homography,
    rotation_angle,
)

__all__ = ["TERMS", "GeodesicLoss", "ParameterMSELoss", "nonfinite_samples"]

IDENTITY_PARAMS = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0)
_IDENTITY = np.array(IDENTITY_PARAMS, np.float32)

Tensor = Any  # a backend tensor: tf.Tensor (TensorFlow) or jax.Array (JAX)


def _as_float32_params(y_true, y_pred) -> tuple[Tensor, Tensor]:
    return ops.cast(y_true, "float32"), ops.cast(y_pred, "float32")


def _finite_rows(x: Tensor) -> Tensor:
    return ops.all(ops.isfinite(x), axis=-1)


def _substitute(ok: Tensor, y_true: Tensor, y_pred: Tensor):
    """Replace the samples where ``ok`` is False by the identity pair."""
    identity = ops.convert_to_tensor(_IDENTITY)
    keep = ok[..., None]
    return ops.where(keep, y_true, identity), ops.where(keep, y_pred, identity)


def _evaluate(fn, y_true: Tensor, y_pred: Tensor) -> Tensor:
    return fn(params_to_matrix(y_true), params_to_matrix(y_pred))


def _finite_samples(y_true: Tensor, y_pred: Tensor) -> Tensor:
    """Boolean ``(batch,)``: inputs finite and ``M`` finite (a forward pass without gradient;
    a finite ``M`` has entries <= ``1 / eps``, so ``P``, angle and residual are finite too)."""
    ok = ops.logical_and(_finite_rows(y_true), _finite_rows(y_pred))
    m = ops.stop_gradient(_evaluate(relative_homography, *_substitute(ok, y_true, y_pred)))
    return ops.logical_and(ok, ops.all(ops.isfinite(m), axis=(-2, -1)))


def _guarded(fn: Callable[[Tensor, Tensor], Tensor], y_true: Tensor, y_pred: Tensor) -> Tensor:
    """Per-sample ``fn(T, T_hat)`` that is 0, with a 0 gradient, for non-finite samples.

    "Double where": a sample with a non-finite input or ``M`` is replaced by the identity pair
    BEFORE the differentiated computation, then its output (and any non-finite output) set to 0.
    """
    ok = _finite_samples(y_true, y_pred)
    value = _evaluate(fn, *_substitute(ok, y_true, y_pred))
    return ops.where(ops.logical_and(ok, ops.isfinite(value)), value, ops.zeros_like(value))


def _check_weight(name: str, value: float, note: str = "") -> float:
    w = float(value)
    if not (math.isfinite(w) and w >= 0.0):
        raise ValueError(f"{name} must be a finite number >= 0{note}, got {value!r}")
    return w


def _check_projection_weight(projection_weight: float) -> float:
    return _check_weight("projection_weight", projection_weight,
                         " (the paper's lambda, 1.0 in all its experiments; e.g. 1.0)")


def _frame_matrices(frame: Sequence[Sequence[float]] | None):
    """``(F, F^{-1})`` float32 NumPy arrays of a 3x3 change of frame, or None (the model frame)."""
    if frame is None:
        return None
    f = np.asarray(frame, np.float64)
    if f.shape != (3, 3) or not np.all(np.isfinite(f)) or abs(np.linalg.det(f)) < 1e-12:
        raise ValueError(f"frame must be an invertible 3x3 matrix (model -> loss frame, e.g. "
                         f"the inverse of conventions.md's N for pixels), got {frame!r}")
    return f.astype(np.float32), np.linalg.inv(f).astype(np.float32)


def _residual(m: Tensor, projection: str = "svd") -> Tensor:
    """``||M - P||_F^2``, ``P = project_to_so3(M, projection)``: ``(..., 3, 3) -> (...)``."""
    return ops.sum(ops.square(m - project_to_so3(m, projection)), axis=(-2, -1))


RESIDUAL_FRAMES = ("loss", "unit")


#: The terms of `GeodesicLoss` in the order they are shown (`GeodesicLoss.terms`).
TERMS = ("angle", "residual", "mse", "chordal")


class _Terms:
    """The per-sample terms of `GeodesicLoss` on matrices ``(B, 3, 3) x 2 -> (B,)`` each, and
    their sum. ``values`` computes only those asked for (`TERMS`, or ``"theta"``: the angle in
    radians in the loss's frame, not a term of the sum)."""

    def __init__(self, loss: GeodesicLoss):
        self.loss = loss
        self.frame = _frame_matrices(loss.frame)
        self.std = None if loss.mse_std is None else np.array(loss.mse_std, np.float32)
        weights = {"angle": 1.0, "residual": loss.projection_weight, "mse": loss.mse_weight,
                   "chordal": loss.chordal_weight}
        self.present = tuple(name for name in TERMS if weights[name] > 0)

    def values(self, t: Tensor, t_hat: Tensor, names: Collection[str]) -> dict[str, Tensor]:
        c, out = self.loss, {}
        if "mse" in names:  # AETv1's parameter MSE (std-normalised), in the model frame
            diff = matrix_to_params(t_hat) - matrix_to_params(t)
            if self.std is not None:
                diff = diff / ops.convert_to_tensor(self.std)
            out["mse"] = c.current_mse_weight() * ops.mean(ops.square(diff), axis=-1)
        if not set(names) & {"angle", "theta", "residual", "chordal"}:
            return out
        unit_residual = c.residual_frame == "unit" and self.frame is not None
        if "residual" in names and unit_residual:  # of M in the unit model frame, before the zoom
            residual = _residual(relative_homography(t, t_hat), c.projection)
        if self.frame is not None:  # T' = F T F^{-1}: the same map written in another frame
            f, f_inv = self.frame
            f, f_inv = ops.convert_to_tensor(f), ops.convert_to_tensor(f_inv)
            t, t_hat = (ops.matmul(ops.matmul(f, x), f_inv) for x in (t, t_hat))
        m = relative_homography(t, t_hat)
        if set(names) & {"angle", "theta"} or ("residual" in names and not unit_residual):
            p = project_to_so3(m, c.projection)
        if "residual" in names:
            if not unit_residual:
                residual = ops.sum(ops.square(m - p), axis=(-2, -1))
            if c.residual_scale > 0:  # bounded growth: r for small r, b log(r / b) for large r
                residual = c.residual_scale * ops.log1p(residual / c.residual_scale)
            out["residual"] = c.projection_weight * residual
        if set(names) & {"angle", "theta"}:
            out["theta"] = rotation_angle(p)
            out["angle"] = out["theta"] if c.angle_power == 1 else ops.square(out["theta"])
        if "chordal" in names:  # ||M - I||_F^2 ~ ||Log M||^2 near I; no cut locus at pi
            out["chordal"] = c.chordal_weight * ops.sum(
                ops.square(m - ops.eye(3, dtype=m.dtype)), axis=(-2, -1))
        return out

    def __call__(self, t: Tensor, t_hat: Tensor) -> Tensor:
        terms = self.values(t, t_hat, self.present)
        value = ops.zeros_like(t[..., 0, 0])
        if "mse" in terms:
            value += terms["mse"]
        value += terms["angle"] + terms["residual"] if "residual" in terms else terms["angle"]
        if "chordal" in terms:
            value += terms["chordal"]
        return value


@keras.saving.register_keras_serializable(package="aetv2_tf")
class GeodesicLoss(keras.losses.Loss):
    """AETv2 loss (Eq. 11): geodesic angle on SO(3) + ``lambda`` x projection residual.

    Per sample, ``M = normalize_determinant(T^{-1} T_hat)``, ``P = project_to_so3(M)``,
    ``loss = angle(P) + projection_weight * ||M - P||_F^2`` (the paper's form, the default; the
    other arguments are docs/reproduction.md's knobs, off by default):

    Args:
      projection_weight: the paper's ``lambda >= 0`` (default 1.0, as in the paper).
      angle_power: 1 (the paper's ``theta``) or 2 (``theta^2 = ||log P||_F^2 / 2``, Rodrigues).
      residual_scale: ``b > 0`` replaces the residual ``r`` by ``b log(1 + r / b)`` (equal for
        small ``r``, logarithmic where ``M`` nears a singular matrix); 0: ``r`` (the paper).
      chordal_weight: ``mu >= 0`` adds ``mu ||M - I||_F^2``, the first-order form of the full
        group's ``||Log(T^{-1} T_hat)||^2`` (Eq. 5): no cut locus, a gradient at ``theta = pi``.
      mse_weight, mse_std: ``w >= 0`` adds ``w`` x AETv1's MSE of the 8 parameters divided by
        ``mse_std`` (8 positive floats, or None for 1).
      mse_decay_steps: ``n > 0`` decays the MSE weight linearly from ``w`` at step 0 to 0 at step
        ``n`` (then the loss is purely geodesic): an MSE warm-up. The step is read from
        ``loss.step``, a scalar variable the caller sets (e.g. ``optimizer.iterations``); 0: a
        constant ``w``.
      frame: a 3x3 matrix ``F`` (model frame -> loss frame): the loss is evaluated on
        ``F T F^{-1}`` and ``F T_hat F^{-1}`` (e.g. ``N^{-1}`` of conventions.md: pixels);
        None: the model frame.
      residual_frame: ``"loss"`` (default): the residual on the ``M`` of ``frame``, as the
        angle; ``"unit"``: on the ``M`` of the unit model frame (before ``F``), the angle
        staying in ``frame``.
      projection: "svd" or "newton" (`geometry.project_to_so3`).
      name, reduction: as `keras.losses.Loss`.

    Non-finite protection: a sample with a NaN/inf in ``y_true``/``y_pred``, or a non-finite
    loss, contributes loss 0 AND gradient 0; the reduction still divides by the FULL batch size
    (`nonfinite_samples` counts them). A singular ``T_hat`` gives a finite but large loss and
    gradient (the clamp of `geometry.normalize_determinant`): initialise the decoder near the
    identity, not at 0.
    """

    def __init__(self, projection_weight: float = 1.0, angle_power: int = 1,
                 residual_scale: float = 0.0, chordal_weight: float = 0.0, mse_weight: float = 0.0,
                 mse_std: Sequence[float] | None = None, mse_decay_steps: int = 0,
                 frame: Sequence[Sequence[float]] | None = None, residual_frame: str = "loss",
                 projection: str = "svd", name: str = "geodesic_loss",
                 reduction: str | None = "sum_over_batch_size"):
        super().__init__(name=name, reduction=reduction, dtype="float32")
        self.projection_weight = _check_projection_weight(projection_weight)
        if angle_power not in (1, 2):
            raise ValueError(f"angle_power must be 1 (the paper's theta) or 2 (theta^2), "
                             f"got {angle_power!r}")
        self.angle_power = int(angle_power)
        self.residual_scale = _check_weight("residual_scale", residual_scale, " (0: off)")
        self.chordal_weight = _check_weight("chordal_weight", chordal_weight, " (0: off)")
        self.mse_weight = _check_weight("mse_weight", mse_weight, " (0: off)")
        self.mse_std = _check_vector("mse_std", mse_std, positive=True)
        if int(mse_decay_steps) != mse_decay_steps or mse_decay_steps < 0:
            raise ValueError(f"mse_decay_steps must be an int >= 0 (0: constant), "
                             f"got {mse_decay_steps!r}")
        self.mse_decay_steps = int(mse_decay_steps)
        self.step = None  # set by the caller when mse_decay_steps > 0
        self.frame = None if frame is None else [[float(v) for v in row] for row in frame]
        if residual_frame not in RESIDUAL_FRAMES:
            raise ValueError(f"residual_frame must be one of {RESIDUAL_FRAMES} (the frame of "
                             f"the projection residual), got {residual_frame!r}")
        self.residual_frame = residual_frame
        if projection not in PROJECTIONS:
            raise ValueError(f"projection must be one of {PROJECTIONS} (how the nearest "
                             f"rotation is computed), got {projection!r}")
        self.projection = projection
        self._terms = _Terms(self)

    def current_mse_weight(self) -> Tensor | float:
        """The MSE term's weight at ``self.step`` (``mse_weight`` if there is no decay)."""
        if not self.mse_decay_steps:
            return self.mse_weight
        if self.step is None:
            raise ValueError("GeodesicLoss(mse_decay_steps > 0) needs loss.step = a step "
                             "variable (e.g. optimizer.iterations) before it is called")
        done = ops.cast(ops.convert_to_tensor(self.step), "float32") / self.mse_decay_steps
        return self.mse_weight * ops.maximum(1.0 - done, 0.0)

    @property
    def terms(self) -> tuple[str, ...]:
        """The terms this loss adds up, in `TERMS` order: ``"angle"`` always, then those of
        weight > 0."""
        return self._terms.present

    def term(self, name: str, y_true, y_pred) -> Tensor:
        """Per-sample ``(batch,)`` value of one term as the loss adds it (weight and non-finite
        protection included; over `terms` they sum to ``call``), or ``"theta"`` (radians)."""
        if name not in (*TERMS, "theta"):
            raise ValueError(f"term must be one of {(*TERMS, 'theta')}, got {name!r}")
        y_true, y_pred = _as_float32_params(y_true, y_pred)
        return _guarded(lambda t, t_hat: self._terms.values(t, t_hat, (name,))[name], y_true,
                        y_pred)

    def call(self, y_true, y_pred) -> Tensor:
        y_true, y_pred = _as_float32_params(y_true, y_pred)
        return _guarded(self._terms, y_true, y_pred)

    def get_config(self) -> dict:
        return {**super().get_config(), "projection_weight": self.projection_weight,
                "angle_power": self.angle_power, "residual_scale": self.residual_scale,
                "chordal_weight": self.chordal_weight, "mse_weight": self.mse_weight,
                "mse_std": self.mse_std, "mse_decay_steps": self.mse_decay_steps,
                "frame": self.frame, "residual_frame": self.residual_frame,
                "projection": self.projection}


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

    ``mean`` cancels and is kept for the record only; ``std`` (8 positive floats, None: 1)
    rescales each parameter. No non-finite protection. ``target="official"``: the error of
    `geometry.aetv1_official_targets` of both sides for ``image_size`` images (``std`` None).
    """

    def __init__(self, mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                 name: str = "parameter_mse", reduction: str | None = "sum_over_batch_size",
                 target: str = "model", image_size: int = 32):
        super().__init__(name=name, reduction=reduction, dtype="float32")
        self.mean = _check_vector("mean", mean, positive=False)
        self.std = _check_vector("std", std, positive=True)
        if target not in ("model", "official"):
            raise ValueError(f"target must be 'model' or 'official', got {target!r}")
        if target == "official" and std is not None:
            raise ValueError("target='official' normalises with the AETv1 code's fixed "
                             "constants: pass std=None")
        self.target, self.image_size = target, int(image_size)

    def call(self, y_true, y_pred) -> Tensor:
        y_true, y_pred = _as_float32_params(y_true, y_pred)
        if self.target == "official":
            y_true = aetv1_official_targets(y_true, self.image_size)
            y_pred = aetv1_official_targets(y_pred, self.image_size)
        diff = y_pred - y_true
        if self.std is not None:
            diff = diff / ops.convert_to_tensor(np.array(self.std, np.float32))
        return ops.mean(ops.square(diff), axis=-1)

    def get_config(self) -> dict:
        return {**super().get_config(), "mean": self.mean, "std": self.std,
                "target": self.target, "image_size": self.image_size}


@keras.saving.register_keras_serializable(package="aetv2_tf")
def nonfinite_samples(y_true, y_pred) -> Tensor:
    """Metric ``(batch, 8) x 2 -> (batch,)``: 1.0 where `GeodesicLoss` zeroes the sample out."""
    y_true, y_pred = _as_float32_params(y_true, y_pred)
    return 1.0 - ops.cast(_finite_samples(y_true, y_pred), "float32")
