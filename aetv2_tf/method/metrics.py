"""Training metrics of the AET pretext task, on (batch, 8) homography parameters.

Shown in this order (`shown_order`): ``loss`` (without the weight decay) and the terms of a
`losses.GeodesicLoss` that sum to it (``angle_term``, then those of weight > 0: ``residual_term``,
``mse_term``, ``chordal_term``; shown by `models.displayed_loss`); ``angle_deg`` (the angle of
the error ``T^-1 T_hat``'s projection in degrees, in the loss's frame; the model frame for the
AETv1 MSE); ``rotation_accuracy`` (the right quarter turn, chance 25%); ``l2_penalty`` (the
coupled weight decay's penalty, added to no loss). `geodesic_angle_deg` and
`projection_residual` (unit model frame) stay registered so that models saved with them reload.
Only ``keras.ops``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import keras
from keras import ops

from aetv2_tf.method.geometry import aetv2_components, params_to_matrix
from aetv2_tf.method.losses import TERMS, GeodesicLoss

#: The scalar of the optimizer's coupled L2 weight decay, shown apart from the ``loss``.
PENALTY = "l2_penalty"
#: The names a training shows, in the order shown (`shown_order`).
SHOWN = ("loss", "angle_term", "residual_term", "mse_term", "chordal_term", "angle_deg",
         "rotation_accuracy", PENALTY)


def _matrices(y_true, y_pred):
    return (params_to_matrix(ops.cast(y_true, "float32")),
            params_to_matrix(ops.cast(y_pred, "float32")))


@keras.saving.register_keras_serializable(package="aetv2_tf")
def geodesic_angle_deg(y_true, y_pred):
    """(B,) rotation angle of the projected T^{-1} T_hat in the UNIT model frame, degrees."""
    angle, _ = aetv2_components(*_matrices(y_true, y_pred))
    return angle * (180.0 / math.pi)


@keras.saving.register_keras_serializable(package="aetv2_tf")
def projection_residual(y_true, y_pred):
    """(B,) ||M - P||_F^2 of Eq. (11) in the UNIT model frame, unweighted."""
    return aetv2_components(*_matrices(y_true, y_pred))[1]


def rotation_index(t):
    """(..., 3, 3) model-frame homographies -> (...,) int32 quarter turns k in {0, 1, 2, 3}.

    k is read from the direction in which t sends the image's rightward axis (from the centre to
    the middle of the right edge), counted counter-clockwise on screen like the sampler's k.
    """
    p0 = t[..., :, 2]
    p1 = t[..., :, 0] + t[..., :, 2]
    d = p1[..., :2] / p1[..., 2:] - p0[..., :2] / p0[..., 2:]
    angle = ops.arctan2(-d[..., 1], d[..., 0])
    return ops.mod(ops.cast(ops.round(angle / (math.pi / 2)), "int32"), 4)


@keras.saving.register_keras_serializable(package="aetv2_tf")
def rotation_accuracy(y_true, y_pred):
    """(B,) 1.0 where T_hat implies the same quarter turn as T."""
    t, t_hat = _matrices(y_true, y_pred)
    return ops.cast(ops.equal(rotation_index(t), rotation_index(t_hat)), "float32")


@keras.saving.register_keras_serializable(package="aetv2_tf")
class LossTerm(keras.metrics.Mean):
    """The running mean of one per-sample term of a `GeodesicLoss` (`GeodesicLoss.term`)
    times ``scale``; ``term``: one of `losses.TERMS` or ``"theta"`` (``angle_deg`` is theta
    times ``180 / pi``). Named ``<term>_term`` unless ``name`` is given."""

    def __init__(self, loss: GeodesicLoss | dict[str, Any], term: str, scale: float = 1.0,
                 name: str | None = None, dtype: Any = None):
        super().__init__(name=name or f"{term}_term", dtype=dtype)
        if isinstance(loss, dict):
            loss = keras.saving.deserialize_keras_object(loss)
        if not isinstance(loss, GeodesicLoss):
            raise TypeError(f"LossTerm: loss must be a GeodesicLoss, got {loss!r}")
        if term not in (*TERMS, "theta"):
            raise ValueError(f"LossTerm: term must be one of {(*TERMS, 'theta')}, got {term!r}")
        self.loss, self.term, self.scale = loss, term, float(scale)

    def update_state(self, y_true, y_pred, sample_weight=None):
        values = self.loss.term(self.term, y_true, y_pred)
        if self.scale != 1.0:
            values = values * self.scale
        return super().update_state(values, sample_weight=sample_weight)

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "term": self.term, "scale": self.scale,
                "loss": keras.saving.serialize_keras_object(self.loss)}


def pretext_metrics(loss: keras.losses.Loss | None = None) -> list[keras.metrics.Metric]:
    """The metrics compiled with ``loss``: ``angle_deg`` in the frame of a `GeodesicLoss` (any
    other loss, or None: the model frame) and ``rotation_accuracy``."""
    angle_of = loss if isinstance(loss, GeodesicLoss) else GeodesicLoss(projection_weight=0.0)
    return [LossTerm(angle_of, "theta", 180.0 / math.pi, name="angle_deg"),
            keras.metrics.MeanMetricWrapper(rotation_accuracy, name="rotation_accuracy")]


def shown_order(names: Iterable[str]) -> list[str]:
    """``names`` in the order shown: those of `SHOWN` in its order, then the others sorted."""
    names = list(names)
    return [n for n in SHOWN if n in names] + sorted(n for n in names if n not in SHOWN)
