"""Training metrics of the AET pretext task, on (batch, 8) homography parameters.

What a pretext model shows, in this order (`shown_order`):

* ``loss`` (the pretext loss, without the weight decay) and the terms of a
  `losses.GeodesicLoss` as it adds them up: ``angle_term`` (theta, or theta^2, in the loss's
  frame), then only those whose weight is above 0: ``residual_term`` (lambda x the projection
  residual), ``mse_term`` (the weighted AETv1 MSE), ``chordal_term``. They fall when
  pretraining works, and sum to the loss; the model shows them (`models.displayed_loss`: computed
  with the loss, at its step);
* the metrics compiled (`pretext_metrics`, built from the loss the model is compiled with;
  the recipe's through `recipes.Recipe.metrics`): ``angle_deg``, the rotation angle of the
  error ``T^-1 T_hat``'s projection in degrees, in the frame the loss measures it in (the
  recipe's 4x zoomed frame: the angle the loss sees; the model frame for the AETv1 MSE, which
  has no frame); it falls too;
* ``rotation_accuracy``: whether the decoded homography turns the image by the right multiple
  of 90 degrees (chance: 25%); it rises;
* ``l2_penalty``: the penalty of the optimiser's coupled weight decay (its gradient is added to
  the gradient, the penalty to no loss), shown apart.

`geodesic_angle_deg` and `projection_residual` (the angle and residual in the UNIT model frame,
whatever the loss) are the metrics of versions before these; they stay registered so that a
model saved with them reloads. Every metric here is a registered Keras object. Written with
``keras.ops`` only (TensorFlow or JAX backend; no TensorFlow import).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import keras
from keras import ops

from aetv2_tf.method.geometry import aetv2_components, params_to_matrix
from aetv2_tf.method.losses import TERMS, GeodesicLoss

#: The scalar of the optimizer's coupled L2 weight decay, shown apart from the ``loss``
#: (`models.displayed_loss`).
PENALTY = "l2_penalty"
#: The names a training shows, in the order shown (`shown_order`).
SHOWN = ("loss", "angle_term", "residual_term", "mse_term", "chordal_term", "angle_deg",
         "rotation_accuracy", PENALTY)


def _matrices(y_true, y_pred):
    return (params_to_matrix(ops.cast(y_true, "float32")),
            params_to_matrix(ops.cast(y_pred, "float32")))


@keras.saving.register_keras_serializable(package="aetv2_tf")
def geodesic_angle_deg(y_true, y_pred):
    """(B,) rotation angle of the projected T^{-1} T_hat in the UNIT model frame, in degrees
    (not the frame of a zoomed loss: `pretext_metrics`' ``angle_deg`` is)."""
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
    """The running mean of one per-sample term of a `GeodesicLoss` (`GeodesicLoss.term`: its
    weight, frame and non-finite protection included), times ``scale``: ``angle_deg`` is
    ``"theta"`` (the angle in the loss's frame, radians) times ``180 / pi``.

    ``term``: one of `losses.TERMS` (a decaying MSE term reads the loss's step, which only the
    loss's own computation can: `models.displayed_loss` shows the terms of a model's loss), or
    ``"theta"``. Named ``<term>_term`` unless ``name`` is given."""

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
    """The metrics compiled into a pretext model with ``loss`` (module docstring): the angle
    in degrees in the frame of a `GeodesicLoss` (for any other loss, the AETv1 MSE, or None: in
    the model frame) and the quarter-turn accuracy. (The loss's terms are the model's to show:
    `models.displayed_loss`.)"""
    angle_of = loss if isinstance(loss, GeodesicLoss) else GeodesicLoss(projection_weight=0.0)
    return [LossTerm(angle_of, "theta", 180.0 / math.pi, name="angle_deg"),
            keras.metrics.MeanMetricWrapper(rotation_accuracy, name="rotation_accuracy")]


def shown_order(names: Iterable[str]) -> list[str]:
    """``names`` in the order shown: those of `SHOWN` in its order (the loss, its terms, the
    angle, the quarter-turn accuracy, the penalty), then the others alphabetically (the order
    of Keras's logs)."""
    names = list(names)
    return [n for n in SHOWN if n in names] + sorted(n for n in names if n not in SHOWN)
