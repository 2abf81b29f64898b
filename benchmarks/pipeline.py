"""Pretext input-pipeline throughput: `python -m benchmarks.pipeline`.

The training program's tf.data pipeline (`aetv2_tf.data.pipelines.pretext_dataset` on the real
CIFAR-10: shuffled batches, crop + flip, homography sampling, warp, normalisation) is drained
batch after batch, measured two ways, interleaved:

* `1 core`: tf.data options `threading.private_threadpool_size=1` and
  `threading.max_intra_op_parallelism=1`: the pipeline's cost in core-seconds;
* `all cores`: the pipeline as the training program builds it (AUTOTUNE parallelism, prefetch).

and compared with the training step (`benchmarks.step`, `fused/auto/geodesic`: the default
training configuration), measured in the same rounds unless `--step_rate` is given. The ratio
pipeline / step says how far the input is from being the bottleneck, and `step / (1-core rate)`
is the fraction of one core that feeding the training costs.

With `--fit_steps` > 0, the same model is also trained through `model.fit` on the real pipeline
and on one in-memory batch, interleaved: their ratio is the end-to-end cost of the input
pipeline while training (prefetch overlaps it with the step; the cores are shared).
Each round builds fresh iterators and times from the first batch on, so no batch prefetched
during another measurement is counted.
"""

from __future__ import annotations

import time

from benchmarks import common
from benchmarks.step import Result, add_step_flags
from benchmarks.step_runner import Spec, StepRunner, example_batch

STEP_CONFIG = "fused/auto/geodesic"
TARGET_RATIO = 10.0


def load_images(data_dir: str, limit: int = 0):
    """The CIFAR-10 training images, uint8 (N, 32, 32, 3)."""
    from aetv2_tf.data.sources import load_cifar10

    images, _ = load_cifar10(data_dir, "train")
    return images[:limit] if limit else images


def pipeline(images, batch_size: int, threads: int = 0):
    """The training program's pretext dataset; `threads` > 0 confines it to that many threads."""
    import tensorflow as tf

    from aetv2_tf.data.pipelines import pretext_dataset

    ds = pretext_dataset(images, batch_size, seed=0)
    if threads:
        options = tf.data.Options()
        options.threading.private_threadpool_size = threads
        options.threading.max_intra_op_parallelism = threads
        ds = ds.with_options(options)
    return ds


def drain(dataset, batches: int) -> float:
    """Seconds to pull `batches` batches from a fresh iterator, timed from its first batch."""
    iterator = iter(dataset)
    next(iterator)
    t0 = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return time.perf_counter() - t0


class Timed:
    """A run whose own measured seconds replace the wall time of the call (start-up excluded)."""

    def __init__(self, fn):
        self.fn, self.seconds = fn, []

    def __call__(self) -> None:
        self.seconds.append(self.fn())


def main() -> None:
    common.keras_quiet()
    p = common.parser(__doc__)
    add_step_flags(p)
    p.set_defaults(steps=3)
    p.add_argument("--data_dir", default=str(common.DEFAULT_CIFAR10),
                   help="The cifar-10-batches-py directory.")
    p.add_argument("--train_examples", type=int, default=0,
                   help="Use the first N training images (0: all 50,000).")
    p.add_argument("--batches", type=int, default=60, help="Batches drained per round.")
    p.add_argument("--step_rate", type=float, default=0.0,
                   help="Training pairs/s to compare with (0: measure fused/auto/geodesic here).")
    p.add_argument("--fit_steps", type=int, default=0,
                   help="Also time model.fit on the pipeline vs on an in-memory batch, this many "
                        "steps a round (0: skip).")
    args = p.parse_args()
    common.configure_threads(args)
    load = common.load_average()
    images = load_images(args.data_dir, args.train_examples)
    variants = {"pipeline, 1 core": 1, "pipeline, all cores": 0}
    datasets = {name: pipeline(images, args.batch_size, t) for name, t in variants.items()}
    drains = {name: Timed(lambda ds=ds: drain(ds, args.batches)) for name, ds in datasets.items()}
    for run in drains.values():  # warm-up: first iterators, traced functions
        run()
        run.seconds.clear()
    runs: dict = dict(drains)
    runner = None
    if not args.step_rate or args.fit_steps:
        runner = StepRunner(Spec.parse(STEP_CONFIG), example_batch(args.batch_size))
        runner.run(args.warmup)
        real = pipeline(images, args.batch_size)
        if not args.step_rate:
            runs["training step (in-memory batch)"] = lambda: runner.run(args.steps)
        if args.fit_steps:
            runner.run(args.warmup, real)
            runs["fit on the pipeline"] = lambda: runner.run(args.fit_steps, real)
            runs["fit on an in-memory batch"] = lambda: runner.run(args.fit_steps)
    timings = common.interleave(runs, args.repeats)

    pairs = args.batches * args.batch_size
    rates = {name: common.median(pairs / s for s in run.seconds) for name, run in drains.items()}
    step_name = "training step (in-memory batch)"
    step_rate = args.step_rate or Result.of(
        timings[step_name], runner.round_steps(args.steps) * args.batch_size).pairs_per_s
    rows = [[name, f"{rate:.0f}", common.spread([pairs / s for s in drains[name].seconds]),
             f"{rate / step_rate:.1f}x"] for name, rate in rates.items()]
    rows.append([step_name if not args.step_rate else "training step (--step_rate)",
                 f"{step_rate:.1f}", "-", "1.0x"])
    notes = [f"Pretext pipeline on {len(images)} CIFAR-10 images, batch {args.batch_size}, "
             f"{args.batches} batches x {args.repeats} interleaved rounds; training step "
             f"{STEP_CONFIG} (precision {Spec.parse(STEP_CONFIG).precision}) of "
             f"{args.steps} steps a round.",
             f"Feeding the training costs {100 * step_rate / rates['pipeline, 1 core']:.1f}% of "
             f"one core ({100 * step_rate / rates['pipeline, 1 core'] / common.cores():.1f}% of "
             f"the machine's {common.cores()} cores).",
             f"Target pipeline >= {TARGET_RATIO:.0f}x training rate on 1 core: "
             f"{rates['pipeline, 1 core'] / step_rate:.1f}x, "
             f"{'met' if rates['pipeline, 1 core'] >= TARGET_RATIO * step_rate else 'MISSED'}."]
    if args.fit_steps:
        fit = {name: Result.of(timings[name], runner.round_steps(args.fit_steps) * args.batch_size)
               for name in ("fit on the pipeline", "fit on an in-memory batch")}
        base = fit["fit on an in-memory batch"].pairs_per_s
        rows += [[name, f"{r.pairs_per_s:.1f}", common.spread(r.rates),
                  f"{r.pairs_per_s / base:.2f}x of in-memory"] for name, r in fit.items()]
    table = common.markdown_table(["measured", "pairs/s", "round spread", "vs training step"],
                                  rows)
    common.report("Input pipeline (benchmarks.pipeline)", table, args, notes, load_before=load)


if __name__ == "__main__":
    main()
