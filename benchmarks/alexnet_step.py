"""AlexNet AET pair-step rate at 224x224 on any Keras backend: `python -m benchmarks.alexnet_step`.

The ImageNet pretext step as `KERAS_BACKEND=jax` trains it (`aetv2_tf.models.pairs`): uint8 crops
`(B, 224, 224, 3)` in, the homography pairs made on the device (`HomographyPairs`, ImageNet
normalisation), the Siamese AlexNet on the joint batch `2B`, the fc7 decoder, the geodesic loss,
Adam; `model.fit` with `steps_per_execution`. The images are random uint8 arrays that `fit`
sends to the device each step, as a decoded input batch would be sent, so the rate includes the
host-to-device copy but no JPEG decoding: it is the rate an input pipeline must feed (issue "An
ImageNet input that feeds accelerators": cores per accelerator = this rate / pairs per CPU-s).

    KERAS_BACKEND=jax python -m benchmarks.alexnet_step --batch=256 --steps=60 --repeats=3
    KERAS_BACKEND=jax python -m benchmarks.alexnet_step --batch=4 --steps=2 --repeats=1  # CPU check

Prints one line per timed repeat and a final `RESULT` line with the median pairs/s.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from aetv2_tf.data.constants import IMAGENET_MEAN, IMAGENET_STD  # aetv2_tf first: oneDNN setting


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256, help="pairs per step")
    parser.add_argument("--size", type=int, default=224, help="crop side in pixels")
    parser.add_argument("--steps", type=int, default=60, help="timed steps per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps_per_execution", type=int, default=10)
    parser.add_argument("--precision", default="mixed_bfloat16",
                        choices=("mixed_bfloat16", "float32"))
    args = parser.parse_args()
    import keras  # after aetv2_tf (its oneDNN setting precedes any TensorFlow import)

    from aetv2_tf.losses import GeodesicLoss
    from aetv2_tf.models import build_backbone
    from aetv2_tf.models.pairs import build_pairs_model

    spe = min(args.steps_per_execution, args.steps)
    if args.steps % spe:
        parser.error(f"--steps={args.steps} must be a multiple of --steps_per_execution={spe}")

    keras.mixed_precision.set_global_policy(args.precision)
    keras.utils.set_random_seed(0)
    encoder = build_backbone("alexnet", (args.size, args.size, 3), batch_norm="keras")
    model = build_pairs_model(encoder, seed=0, mean=IMAGENET_MEAN, std=IMAGENET_STD)
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss=GeodesicLoss(),
                  steps_per_execution=spe)
    images = np.random.default_rng(0).integers(
        0, 256, (args.batch * spe, args.size, args.size, 3), dtype=np.uint8)

    def fit(steps: int) -> float:
        start = time.perf_counter()
        history = model.fit(images, batch_size=args.batch, epochs=steps // spe,
                            steps_per_epoch=spe, shuffle=False, verbose=0)
        float(history.history["loss"][-1])  # the last step has finished
        return time.perf_counter() - start

    compile_s = fit(spe)
    print(f"backend {keras.backend.backend()}, {args.precision}, batch {args.batch}, "
          f"{args.size}x{args.size}, steps_per_execution {spe}: first {spe} steps "
          f"(compile) {compile_s:.1f} s", flush=True)
    rates = []
    for repeat in range(args.repeats):
        seconds = fit(args.steps)
        rates.append(args.steps * args.batch / seconds)
        print(f"repeat {repeat}: {args.steps} steps in {seconds:.2f} s = {rates[-1]:.0f} pairs/s",
              flush=True)
    print(f"RESULT alexnet_pairs_per_s={statistics.median(rates):.1f} batch={args.batch} "
          f"size={args.size} precision={args.precision} backend={keras.backend.backend()}")


if __name__ == "__main__":
    main()
