"""Per-branch Siamese BatchNorm in one encoder call against two calls, on the running backend.

`python tests/one_pass_case.py ENCODER BATCH_NORM` (ENCODER "tiny" or "nin", BATCH_NORM "keras"
or "fused") prints one JSON line; `compare_one_and_two_passes` returns the same dict in this
process. Two pretext
models of the AETv2 recipe (`Recipe.build_model`, pairs made inside the step) are built on
identically initialised encoders, one with ``one_pass=False`` (two encoder calls, x then t(x)),
one with ``one_pass=True`` (one call on the joint batch, per-half statistics), the second given
the first's weights; on one batch of uint8 images with the same sampler seed:

* ``output``, ``loss``: the largest absolute difference of the training-mode output and of the
  loss (``loss_value``: the two-call model's loss); ``grad``: of each trainable variable's
  gradient, divided by that gradient's largest entry (the largest over the variables);
  ``stats``: of the moving statistics after that forward pass, divided by their largest entry;
* ``weights_1``, ``weights_2``: of the trainable variables after one and after two
  `train_on_batch` steps (SGD), divided by the largest change of any of them in those steps
  (``moved``: a BN beta's gradient is a sum that nearly cancels, so its few updates are
  rounding-sized and only the update's scale measures them); ``stats_1``, ``stats_2``: of the
  moving statistics then, divided by their largest entry;
* ``groups``: the models' ``batch_groups`` (1 and 2), ``stats_moved``: how far the moving
  statistics moved in the forward pass (they must move).

The decoder starts at a 45-degree rotation: at 0 every 180-degree pair sits on the geodesic
loss's cut locus, where its gradient jumps with any rounding (docs/reproduction.md).
"""

from __future__ import annotations

import json
import sys

import numpy as np


def tiny_bn_encoder(batch_norm: str):
    """``(16, 16, 3) -> (8, 8, 8)``: conv + BN + ReLU twice, the second strided."""
    import keras

    from aetv2_tf.models.blocks import conv_bn_relu

    inputs = keras.Input((16, 16, 3))
    x = conv_bn_relu(inputs, 8, 3, name="c1", batch_norm=batch_norm)
    x = conv_bn_relu(x, 8, 3, name="c2", strides=2, padding=1, batch_norm=batch_norm)
    return keras.Model(inputs, x, name="tiny")


def encoder_of(name: str, batch_norm: str):
    from aetv2_tf.models import build_backbone

    return tiny_bn_encoder(batch_norm) if name == "tiny" else \
        build_backbone("nin", (32, 32, 3), batch_norm=batch_norm)


def build(name: str, batch_norm: str, one_pass: bool):
    """The AETv2 pretext model of a fresh encoder, seeded: the same initial weights."""
    import keras

    keras.utils.set_random_seed(0)
    return build_model_on(encoder_of(name, batch_norm), one_pass)


def build_model_on(encoder, one_pass: bool | None):
    """`AETV2.build_model(encoder, one_pass=...)`, compiled with SGD 1e-3."""
    import keras

    import aetv2_tf

    model = aetv2_tf.AETV2.build_model(encoder, 0, one_pass=one_pass, init_rotation_deg=45.0)
    model.compile(optimizer=keras.optimizers.SGD(1e-3))
    model.optimizer.build(model.trainable_variables)
    return model


def model_loss_and_gradients(model, images):
    """``(loss, output, gradients, moving statistics after the forward pass)``, NumPy; the
    model's variables are left as they were."""
    import keras

    if keras.backend.backend() == "jax":
        import functools

        import jax

        value = [[v.value for v in vs] for vs in (model.trainable_variables,
                                                   model.non_trainable_variables,
                                                   model.metrics_variables,
                                                   model.optimizer.variables)]
        fn = jax.jit(jax.value_and_grad(
            functools.partial(model.compute_loss_and_updates, training=True), has_aux=True))
        (loss, (_, out, fixed, _)), grads = fn(value[0], value[1], value[2], images, None,
                                               None, optimizer_variables=value[3])
        return float(loss), np.asarray(out), [np.asarray(g) for g in grads], \
            [np.asarray(v) for v in fixed]
    import tensorflow as tf

    before = model.get_weights()
    with tf.GradientTape() as tape:
        out = model(images, training=True)
        loss = model.compute_loss(x=images, y=None, y_pred=out, training=True)
    grads = tape.gradient(loss, model.trainable_variables)
    fixed = [v.numpy() for v in model.non_trainable_variables]
    model.set_weights(before)
    return float(loss), out.numpy(), [g.numpy() for g in grads], fixed


def _relative(a: list, b: list) -> float:
    pairs = [(np.asarray(x, np.float64), np.asarray(y, np.float64))
             for x, y in zip(a, b, strict=True)]
    return max(float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(x))), 1e-30))
               for x, y in pairs)


def compare_one_and_two_passes(name: str = "tiny", batch_norm: str = "keras",
                               batch: int = 4) -> dict:
    two, one = build(name, batch_norm, False), build(name, batch_norm, True)
    one.set_weights(two.get_weights())
    size = int(two.inputs[0].shape[1])
    images = np.random.default_rng(0).integers(0, 256, (batch, size, size, 3), np.uint8)
    start = [np.asarray(v) for v in two.trainable_variables]
    statistics = [i for i, v in enumerate(two.non_trainable_variables) if "moving" in v.path]
    moving = [np.asarray(two.non_trainable_variables[i]) for i in statistics]
    (l2, o2, g2, s2), (l1, o1, g1, s1) = (model_loss_and_gradients(m, images) for m in (two, one))
    s2, s1 = ([s[i] for i in statistics] for s in (s2, s1))
    got = dict(groups=[two.batch_groups, one.batch_groups], loss=abs(l2 - l1), loss_value=l2,
               output=float(np.max(np.abs(o2 - o1))), grad=_relative(g2, g1),
               stats=_relative(s2, s1), stats_moved=_largest(s2, moving))
    for step in (1, 2):
        for model in (two, one):
            model.train_on_batch(images)
        a, b = ([np.asarray(v) for v in m.trainable_variables] for m in (two, one))
        got[f"weights_{step}"] = _largest(a, b) / _largest(a, start)
        got[f"stats_{step}"] = _relative(*([np.asarray(m.non_trainable_variables[i])
                                            for i in statistics] for m in (two, one)))
    got["moved"] = _largest(a, start)
    return got


def _largest(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
               for x, y in zip(a, b, strict=True))


if __name__ == "__main__":
    print(json.dumps(compare_one_and_two_passes(*sys.argv[1:3])))
