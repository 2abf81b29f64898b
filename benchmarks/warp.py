"""The tf.data warp: TensorFlow's fused kernel vs the device warp, `python -m benchmarks.warp`.

The tf.data pipelines warp with `homographies.warp` (``tf.raw_ops.ImageProjectiveTransformV3``,
one fused kernel); the device path warps with `device.warp` (``keras.ops``: coordinates and
bilinear taps written out, the code a jitted JAX step runs). Both sample the same homographies
(one sampler, `device.components_from_uniform`). This times the two warps on the same real
CIFAR-10 batches inside a tf.data ``map``, interleaved, on 1 core (the pipeline's cost in
core-seconds) and on all cores, so that the tf.data path keeps the fused kernel only where it
is measured faster (issue "One program on every Keras backend").
"""

from __future__ import annotations

from benchmarks import common
from benchmarks.pipeline import Timed, drain, load_images


def warped_batches(images, batch_size: int, which: str, threads: int):
    """Batches of the first images, each warped by fresh homographies with `which` warp."""
    import tensorflow as tf

    from aetv2_tf.data import homographies, warping
    from aetv2_tf.data.constants import AETV1_FILL

    warp = homographies.warp if which == "fused" else warping.warp
    size = images.shape[1]
    x = tf.constant(images[:batch_size].astype("float32") / 255.0)

    def one(i):
        t = homographies.sample_homographies(batch_size, size, size, tf.stack([i, i]))
        return warp(x, t, AETV1_FILL)

    ds = tf.data.Dataset.range(2**62).map(one, num_parallel_calls=tf.data.AUTOTUNE)
    options = tf.data.Options()
    if threads:
        options.threading.private_threadpool_size = threads
        options.threading.max_intra_op_parallelism = threads
    return ds.prefetch(tf.data.AUTOTUNE).with_options(options)


def main() -> None:
    common.keras_quiet()
    p = common.parser(__doc__)
    p.add_argument("--data_dir", default=str(common.DEFAULT_CIFAR10),
                   help="The cifar-10-batches-py directory.")
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--batches", type=int, default=40, help="Batches drained per round.")
    p.add_argument("--repeats", type=int, default=3, help="Interleaved rounds.")
    args = p.parse_args()
    common.configure_threads(args)
    load = common.load_average()
    images = load_images(args.data_dir, args.batch_size)
    runs = {}
    for which in ("fused", "device"):
        for label, threads in (("1 core", 1), ("all cores", 0)):
            ds = warped_batches(images, args.batch_size, which, threads)
            runs[f"{which} warp, {label}"] = Timed(lambda ds=ds: drain(ds, args.batches))
    for run in runs.values():  # warm-up: first iterators, traced functions
        run()
        run.seconds.clear()
    common.interleave(runs, args.repeats)
    pairs = args.batches * args.batch_size
    rates = {name: common.median(pairs / s for s in run.seconds) for name, run in runs.items()}
    rows = []
    for name, rate in rates.items():
        fused = rates[name.replace("device", "fused")]
        rows.append([name, f"{rate:.0f}", common.spread([pairs / s for s in runs[name].seconds]),
                     f"{rate / fused:.2f}x"])
    table = common.markdown_table(["warp in tf.data", "images/s", "spread", "vs fused"], rows)
    common.report("tf.data warp: fused kernel vs device warp (benchmarks.warp)", table, args,
                  load_before=load, notes=[
                      f"{args.batch_size} CIFAR-10 images a batch, fresh homographies each "
                      f"batch (sampling included), {args.batches} batches x {args.repeats} "
                      "interleaved rounds."])


if __name__ == "__main__":
    main()
