"""AlexNet AET pair-step rate at 224x224 on any Keras backend: `python -m benchmarks.alexnet_step`.

The ImageNet pretext step as `KERAS_BACKEND=jax` trains it (`aetv2_tf.models.pretext`): uint8 crops
`(B, 224, 224, 3)` in, the homography pairs made on the device (`HomographyPairs`, ImageNet
normalisation), the Siamese AlexNet on the joint batch `2B`, the fc7 decoder, the geodesic loss,
Adam; `model.fit` with `steps_per_execution`. The images are random uint8 arrays that `fit`
sends to the device each step, as a decoded input batch would be sent, so the rate includes the
host-to-device copy but no JPEG decoding: it is the rate an input pipeline must feed (issue "An
ImageNet input that feeds accelerators": cores per accelerator = this rate / pairs per CPU-s).

    KERAS_BACKEND=jax python -m benchmarks.alexnet_step --batch=256 --steps=60 --repeats=3
    KERAS_BACKEND=jax python -m benchmarks.alexnet_step --batch=4 --steps=2 --repeats=1  # CPU check
    python -m benchmarks.alexnet_step --probe=linear --feature=conv5 --batch=192   # a probe step

`--probe=linear|nonlinear --feature=convN` times a probe's step instead: the frozen AlexNet
(inference mode) under the trainable head of that probe (1000 classes, SGD), on normalised
float32 images sent each step: images/s ("pairs" then means images).

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
    parser.add_argument("--probe", default=None, choices=("linear", "nonlinear"))
    parser.add_argument("--feature", default="conv5", help="--probe: the frozen feature")
    args = parser.parse_args()
    import keras  # after aetv2_tf (its oneDNN setting precedes any TensorFlow import)

    from aetv2_tf.method.losses import GeodesicLoss
    from aetv2_tf.models import build_backbone
    from aetv2_tf.models.pretext import build_pairs_model

    spe = min(args.steps_per_execution, args.steps)
    if args.steps % spe:
        parser.error(f"--steps={args.steps} must be a multiple of --steps_per_execution={spe}")

    keras.mixed_precision.set_global_policy(args.precision)
    keras.utils.set_random_seed(0)
    encoder = build_backbone("alexnet", (args.size, args.size, 3), batch_norm="keras")
    rng = np.random.default_rng(0)
    if args.probe:
        from aetv2_tf.probes.classifier import build_probe

        model = build_probe(encoder, args.feature, args.probe, 1000, (args.size, args.size, 3),
                            batch_norm="keras", pool="max",
                            extra_convs=int(args.probe == "nonlinear" and args.feature == "conv4"))
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9, nesterov=True),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=spe)
        images = rng.standard_normal((args.batch * spe, args.size, args.size, 3), np.float32)
        labels = rng.integers(0, 1000, len(images))
    else:
        model = build_pairs_model(encoder, seed=0, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                                  augment=False)  # the reader crops and flips (the 224 protocol)
        model.compile(optimizer=keras.optimizers.Adam(1e-4), loss=GeodesicLoss(),
                      steps_per_execution=spe)
        images = rng.integers(0, 256, (args.batch * spe, args.size, args.size, 3), np.uint8)
        labels = None

    def fit(steps: int) -> float:
        start = time.perf_counter()
        history = model.fit(images, labels, batch_size=args.batch, epochs=steps // spe,
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
    what = f"probe={args.probe} feature={args.feature} " if args.probe else ""
    print(f"RESULT alexnet_pairs_per_s={statistics.median(rates):.1f} batch={args.batch} "
          f"size={args.size} precision={args.precision} {what}backend={keras.backend.backend()}")


if __name__ == "__main__":
    main()
