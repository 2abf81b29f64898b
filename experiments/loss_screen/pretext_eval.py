"""Held-out pretext diagnostics of a trained AET model: how well it decodes each quarter turn.

    python -m experiments.loss_screen.pretext_eval runs/screen/<name> [--pairs=2048]

Loads `<model_dir>/aet_model.keras`, makes `--pairs` (x, t(x)) pairs from the CIFAR-10 TEST
images (no augmentation, a fixed seed: the same pairs for every model) and prints, per quarter
turn k of the applied homography, the fraction decoded with the right k and the median geodesic
angle of the paper's loss (degrees), as one JSON line. The paper-form loss has no gradient at
theta = pi (k = 2 with a decoder at the identity), which these numbers make visible.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

import aetv2_tf  # noqa: F401  (before TensorFlow: the package asks for oneDNN)


def evaluate(model_dir: str, data_dir: str, pairs: int = 2048) -> dict:
    import keras
    import tensorflow as tf

    import aetv2_tf.models  # noqa: F401  (registers the custom layers for load_model)
    from aetv2_tf.data.pipelines import pretext_dataset
    from aetv2_tf.data.sources import load_cifar10
    from aetv2_tf.method.geometry import params_to_matrix
    from aetv2_tf.method.metrics import geodesic_angle_deg, rotation_index

    model = keras.saving.load_model(os.path.join(model_dir, "aet_model.keras"), compile=False)
    images, _ = load_cifar10(data_dir, "test")
    ds = pretext_dataset(images[:pairs], 256, seed=12345, training=False, augment=False,
                         repeat=False, drop_remainder=False)
    ks, correct, angles = [], [], []
    for (x, tx), p in ds:
        q = tf.cast(model([x, tx], training=False), tf.float32)
        k = rotation_index(params_to_matrix(p)).numpy()
        ks.append(k)
        correct.append(k == rotation_index(params_to_matrix(q)).numpy())
        angles.append(geodesic_angle_deg(p, q).numpy())
    ks, correct, angles = map(np.concatenate, (ks, correct, angles))
    out = {"pairs": int(ks.size), "rotation_accuracy": round(float(correct.mean()), 3),
           "median_angle_deg": round(float(np.median(angles)), 1)}
    for k in range(4):
        sel = ks == k
        out[f"k{k}"] = {"accuracy": round(float(correct[sel].mean()), 3),
                        "median_angle_deg": round(float(np.median(angles[sel])), 1)}
    return out


def main() -> None:
    from benchmarks import common

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir")
    p.add_argument("--pairs", type=int, default=2048)
    p.add_argument("--data_dir", default=str(common.DEFAULT_CIFAR10))
    args = p.parse_args()
    common.keras_quiet()
    print(json.dumps(evaluate(args.model_dir, args.data_dir, args.pairs)))


if __name__ == "__main__":
    main()
