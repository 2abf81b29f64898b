"""Per-branch Siamese BatchNorm against two plain encoder calls, on the backend it is run under.

`python tests/siamese_bn_case.py BACKEND` prints one JSON line: the largest differences between
`build_aet_model(..., siamese_batch_norm="per_branch")` called once in training mode (through
`stateless_call`, the path `fit` takes on JAX, or a `tf.function` on TensorFlow) and a reference
that calls an identically initialised encoder on x, then on t(x), in training mode: the moving
statistics after the step and the decoder's output. Also how far the joint batch's statistics
are from them (they must differ: the branches' batches differ).
"""

from __future__ import annotations

import json
import os
import sys


def main(backend: str) -> dict:
    os.environ["KERAS_BACKEND"] = backend
    import keras
    import numpy as np

    from aetv2_tf.models import build_backbone
    from aetv2_tf.models.aet import build_aet_model

    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 32, 32, 3)).astype("float32")
    tx = (1.5 + 2.0 * rng.standard_normal((6, 32, 32, 3))).astype("float32")

    def build(mode):
        keras.utils.set_random_seed(0)
        encoder = build_backbone("nin", (32, 32, 3))
        return encoder, build_aet_model(encoder, siamese_batch_norm=mode)

    def step(model):
        if backend == "jax":
            trainable = [v.value for v in model.trainable_variables]
            fixed = [v.value for v in model.non_trainable_variables]
            out, fixed = model.stateless_call(trainable, fixed, [x, tx], training=True)
            return np.asarray(out), [np.asarray(v) for v in fixed]
        import tensorflow as tf

        out = tf.function(lambda a, b: model([a, b], training=True))(x, tx)
        return out.numpy(), [v.numpy() for v in model.non_trainable_variables]

    _, per_branch = build("per_branch")
    out, stats = step(per_branch)
    _, joint = build("joint")
    _, joint_stats = step(joint)
    encoder, reference = build("joint")
    features = [encoder(b, training=True)["block4"] for b in (x, tx)]  # x first, then t(x)
    pooled = [keras.ops.mean(f, axis=(1, 2)) for f in features]
    want = reference.get_layer("decoder")(keras.ops.concatenate(pooled, axis=-1))
    want_stats = [np.asarray(v.value) for v in reference.non_trainable_variables]
    return dict(
        output=float(np.max(np.abs(out - np.asarray(want)))),
        stats=max(float(np.max(np.abs(a - b))) for a, b in zip(stats, want_stats, strict=True)),
        joint_stats=max(float(np.max(np.abs(a - b)))
                        for a, b in zip(joint_stats, want_stats, strict=True)),
        num_stats=len(stats))


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
