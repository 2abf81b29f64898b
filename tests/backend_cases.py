"""Backend-neutral evaluation of the AETv2 mathematics, for tests/test_backends.py.

`run(spec, backend)` evaluates values and gradients of `project_to_so3`, `rotation_angle`,
`aetv2_distance` and `GeodesicLoss` on the float32 inputs of ``spec`` (JSON-able lists) and returns
them as JSON-able lists. It imports only keras, numpy and aetv2_tf at module level, and the
autodiff of the backend it is told (``jax`` or ``tensorflow``) inside `run`: the JAX child
process of test_backends.py imports it with TensorFlow blocked.
"""

from __future__ import annotations

import sys

import numpy as np
from keras import ops

from aetv2_tf.method import geometry, losses


def _value_and_grad(backend: str, compiled: bool = False):
    """``f(x) -> (f(x), d sum(f(x)) / dx)`` as NumPy arrays, with the backend's own autodiff;
    ``compiled``: through ``jax.jit`` or ``tf.function(jit_compile=True)`` (XLA) instead."""
    if backend == "jax":
        import jax

        def jax_vg(f, x):
            def total(x):
                y = f(x)
                return ops.sum(y), y

            vg = jax.value_and_grad(total, has_aux=True)
            (_, y), g = (jax.jit(vg) if compiled else vg)(ops.convert_to_tensor(x))
            return np.asarray(y), np.asarray(g)

        return jax_vg
    import tensorflow as tf

    def tf_vg(f, x):
        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = f(x)
                total = tf.reduce_sum(y)
            return y, tape.gradient(total, x)

        y, g = (tf.function(step, jit_compile=True) if compiled else step)(tf.constant(x))
        return y.numpy(), g.numpy()

    return tf_vg


def _f32(x) -> np.ndarray:
    return np.asarray(x, np.float32)


def run(spec: dict, backend: str) -> dict:
    """Evaluate every case of ``spec`` on ``backend``; returns ``{name: {value, grad}}`` lists.

    ``spec`` keys: ``matrices`` (N, 3, 3) and ``weights`` (N, 3, 3) for the projection (value
    ``sum(W * P)`` per sample), ``rotations`` (N, 3, 3) for the angle; ``t`` / ``t_hat``
    (N, 3, 3) for `aetv2_distance`; ``y_true`` / ``y_pred`` (B, 8) and ``variants``
    (``{name: GeodesicLoss kwargs}``) for the loss, ``compiled`` (names of variants also run
    through XLA: ``jax.jit`` / ``jit_compile=True``); ``fd_true`` / ``fd_pred`` (B, 8) for the
    gradient of the summed loss that the caller compares with finite differences.
    """
    out: dict = {}
    m, w = _f32(spec["matrices"]), _f32(spec["weights"])

    def record(name, f, x, compiled=False):
        value, grad = _value_and_grad(backend, compiled)(f, _f32(x))
        out[name] = {"value": value.tolist(), "grad": grad.tolist()}

    record("project_to_so3", lambda x: ops.sum(w * geometry.project_to_so3(x), axis=(-2, -1)), m)
    out["project_to_so3"]["p"] = np.asarray(geometry.project_to_so3(m)).tolist()
    record("rotation_angle", geometry.rotation_angle, spec["rotations"])
    t = _f32(spec["t"])
    record("aetv2_distance", lambda x: geometry.aetv2_distance(t, x), spec["t_hat"])
    y_true = _f32(spec["y_true"])
    fd_true = _f32(spec["fd_true"])
    for name, kwargs in spec["variants"].items():
        loss = losses.GeodesicLoss(**kwargs, reduction=None)
        record(f"loss/{name}", lambda x, loss=loss: loss(y_true, x), spec["y_pred"])
        record(f"fd/{name}", lambda x, loss=loss: loss(fd_true, x), spec["fd_pred"])
        if name in spec["compiled"]:
            record(f"compiled/{name}", lambda x, loss=loss: loss(y_true, x), spec["y_pred"], True)
    out["nonfinite_samples"] = np.asarray(
        losses.nonfinite_samples(y_true, _f32(spec["y_pred"]))).tolist()
    blocked = sys.modules.get("tensorflow", "absent") is None
    out["environment"] = {"backend": backend, "tensorflow_blocked": blocked,
                          "tensorflow_loaded": any(k.split(".")[0] == "tensorflow" and v is not None
                                                   for k, v in sys.modules.items())}
    return out
