"""The AET training step with the two Siamese BatchNorm modes side by side (`--siamese_batch_norm`).

    python -m benchmarks.siamese_bn_speed [--batch=128] [--batches=6] [--repeats=4]

Builds the AETv1 pairs model (`build_pairs_model`, the sampler's parameter scale, Adam 1e-3)
twice, `per_branch` (two encoder calls, x then t(x)) and `joint` (one call on both), with the
same seed, warms both up, then times `fit` over `--batches` batches of random uint8 images, the
two models interleaved `--repeats` times under whatever load the machine has; prints the median
seconds of each and their ratio (per_branch / joint). The global dtype policy is float32 unless
`--policy=mixed_bfloat16`.
"""

from __future__ import annotations

import argparse
import time

import keras
import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--policy", default="float32", choices=["float32", "mixed_bfloat16"])
    args = p.parse_args()
    keras.mixed_precision.set_global_policy(args.policy)
    from aetv2_tf.data.sampler import parameter_std
    from aetv2_tf.method.recipes import AETV1
    from aetv2_tf.models import build_backbone
    from aetv2_tf.models.pretext import build_pairs_model

    std = parameter_std(32)
    models = {}
    for mode in ("joint", "per_branch"):
        keras.utils.set_random_seed(0)
        model = build_pairs_model(build_backbone("nin", (32, 32, 3)), seed=0, param_scale=std,
                                  siamese_batch_norm=mode)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=AETV1.build_loss(32, std),
                      jit_compile=False)
        models[mode] = model
    images = np.random.default_rng(0).integers(0, 256, (args.batch * args.batches, 32, 32, 3),
                                               dtype=np.uint8)
    for model in models.values():  # trace and warm up
        model.fit(images[:2 * args.batch], batch_size=args.batch, epochs=1, verbose=0)
    times: dict[str, list[float]] = {mode: [] for mode in models}
    for _ in range(args.repeats):
        for mode, model in models.items():
            start = time.perf_counter()
            model.fit(images, batch_size=args.batch, epochs=1, verbose=0)
            times[mode].append(time.perf_counter() - start)
    median = {mode: float(np.median(t)) for mode, t in times.items()}
    print(f"| policy | joint s | per_branch s | per_branch / joint |\n|---|---|---|---|\n"
          f"| {args.policy} | {median['joint']:.2f} | {median['per_branch']:.2f} | "
          f"{median['per_branch'] / median['joint']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
