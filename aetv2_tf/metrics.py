"""Training metrics of the AET pretext task, on (batch, 8) homography parameters.

They are diagnostics, not losses: `geodesic_angle_deg` and `projection_residual` are the two terms
of Eq. (11) (reported for the MSE baseline too), `rotation_accuracy` asks whether the decoded
homography turns the image by the right multiple of 90 degrees (chance: 25%). The three are
registered Keras objects, so a model compiled with them reloads with `keras.saving.load_model`.
Written with ``keras.ops`` only (TensorFlow or JAX backend; no TensorFlow import).
"""

from __future__ import annotations

import math

import keras
from keras import ops

from aetv2_tf.geometry import aetv2_components, params_to_matrix


def _matrices(y_true, y_pred):
    return (params_to_matrix(ops.cast(y_true, "float32")),
            params_to_matrix(ops.cast(y_pred, "float32")))


@keras.saving.register_keras_serializable(package="aetv2_tf")
def geodesic_angle_deg(y_true, y_pred):
    """(B,) rotation angle of the projected T^{-1} T_hat, in degrees."""
    angle, _ = aetv2_components(*_matrices(y_true, y_pred))
    return angle * (180.0 / math.pi)


@keras.saving.register_keras_serializable(package="aetv2_tf")
def projection_residual(y_true, y_pred):
    """(B,) ||M - P||_F^2 of Eq. (11)."""
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


def pretext_metrics() -> list[keras.metrics.Metric]:
    """The metrics compiled into the AET model (TensorBoard scalars of the same names)."""
    return [keras.metrics.MeanMetricWrapper(fn, name=fn.__name__)
            for fn in (geodesic_angle_deg, projection_residual, rotation_accuracy)]
