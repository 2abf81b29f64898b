"""ImageNet-size input per CPU-second, stage by stage: `python -m benchmarks.imagenet_input`.

A folder of ImageNet-like JPEGs (`benchmarks.make_folder --photo`: 500 x 375, about 110 KB,
quality 90, 1.2-1.3 ms to decode like ImageNet's own files) is read by tf.data, 64 images a batch,
the file list cycled, and every configuration is measured in the same rounds (interleaved). A
measurement is MARGINAL: the process's CPU time over all threads to drain a fresh iterator of
``--batches`` more batches than a fresh iterator of 2 (the difference of the two), so the
iterator's start-up and the batches its buffers prefetch beyond the last one cancel out; the
process rests between measurements so that no deleted iterator's work is counted:

* `read`: the file's bytes only;
* `decode (the limit)`: ``tf.io.decode_jpeg`` of the whole file: what no pipeline beats;
* `before: crop`: decode, the whole image resized (shorter side 256, antialiased), a random 224
  crop and flip: the protocol as it was implemented before this benchmark
  (`full_resize_then_crop`);
* `before: host pair`: that crop, then the homography warp and the normalisation of the pair on
  the CPU: the TensorFlow program's pretext input as it was;
* `decode window`: ``decode_and_crop_jpeg`` of the crop's window only;
* `now: crop for the device`: `pretext_dataset(files, warp_on_device=True)`: the window decoded,
  resized to the same pixels, flipped, rounded to uint8, with the batch's homographies and
  targets: everything the CPU does per pair with ``--warp=device`` (a GPU warps);
* `now: host pair`: `pretext_dataset(files)`: the same crop, warped and normalised on the CPU
  (the CPU-only program, ``--warp=host``);
* `other pixels: window + area resize`: the window decoded, the crop's region resized with
  ``method="area"`` (a box filter, 3x cheaper than the antialiased triangle): NOT the protocol's
  pixels (`area_pixel_difference` says how far), measured to show what the resize costs;
* `Pillow reader, 1 thread`: `data.stream.FileBatches` (the Keras-on-JAX program's reader:
  Pillow decode, full resize, crop, flip; uint8), one thread.

The ratio of each rate to `decode (the limit)` is the number the issue asks for; with the
accelerator's pair rate (`--pairs_per_accelerator_second`, measured by `benchmarks.alexnet_step`)
it gives the CPU cores one accelerator needs.
"""

from __future__ import annotations

import pathlib
import time

from benchmarks import common

#: The AlexNet pretext step on one H200 (BENCHMARKS.md, "AlexNet on an H200": Keras on JAX,
#: bfloat16, batch 256): the rate an input must feed.
H200_ALEXNET_PAIRS_PER_S = 18_537


def full_resize_then_crop(image, seed, size: int, random: bool):
    """The 224-pixel protocol as first written: the WHOLE image resized (shorter side
    ``round(size * 256 / 224)``, antialiased), then TensorFlow's stateless random crop and flip,
    or the centre crop; float32 [0, 1]. `augment.resize_crop` gives the same pixels."""
    import tensorflow as tf

    from aetv2_tf.data.augment import resize_shorter_side

    resized = resize_shorter_side(image, int(round(size * 256 / 224)))
    if random:
        s_crop, s_flip = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        crop = tf.image.stateless_random_crop(resized, [size, size, 3], s_crop)
        return tf.image.stateless_random_flip_left_right(crop, s_flip)
    hw = tf.shape(resized)[:2]
    top, left = (hw[0] - size) // 2, (hw[1] - size) // 2
    return resized[top:top + size, left:left + size]


def pipelines(files, batch: int) -> dict:
    """{name: dataset of batches} of the module docstring (tf.data, AUTOTUNE, prefetch)."""
    import tensorflow as tf

    from aetv2_tf.data.augment import _crop_plan
    from aetv2_tf.data.constants import IMAGENET_MEAN, IMAGENET_STD
    from aetv2_tf.data.homographies import sample_homographies, warp
    from aetv2_tf.data.pipelines import normalize, pretext_dataset

    paths = tf.constant(files.paths)
    auto = tf.data.AUTOTUNE

    def per_file(fn, then=None):
        ds = tf.data.Dataset.range(2**40).map(
            lambda i: (i, tf.io.read_file(paths[i % len(files.paths)])))
        ds = ds.map(fn, num_parallel_calls=auto).batch(batch)
        return (ds.map(then, num_parallel_calls=auto) if then else ds).prefetch(auto)

    def seed(i):
        return tf.stack([i, tf.constant(1, tf.int64)])

    def old_crop(i, contents):
        return full_resize_then_crop(tf.io.decode_jpeg(contents, channels=3), seed(i), 224, True)

    def host_pair(x):
        t = sample_homographies(tf.shape(x)[0], 224, 224, tf.constant([1, 2], tf.int64),
                                "integer")
        tx = warp(x, t, fill_value=0.5)
        return normalize(x, IMAGENET_MEAN, IMAGENET_STD), normalize(tx, IMAGENET_MEAN,
                                                                    IMAGENET_STD)

    def window(i, contents):
        lo, hi = _crop_plan(tf.image.extract_jpeg_shape(contents)[:2], seed(i), 224, True)[3:]
        image = tf.io.decode_and_crop_jpeg(contents, tf.concat([lo, hi - lo], 0), channels=3)
        return tf.shape(image)

    def area(i, contents):
        return area_crop(contents, seed(i))

    kwargs = dict(image_size=224, mean=IMAGENET_MEAN, std=IMAGENET_STD)
    return {
        "read": per_file(lambda i, c: tf.strings.length(c)),
        "decode (the limit)": per_file(lambda i, c: tf.shape(tf.io.decode_jpeg(c, channels=3))),
        "before: crop": per_file(old_crop),
        "before: host pair": per_file(old_crop, host_pair),
        "decode window": per_file(window),
        "now: crop for the device": pretext_dataset(files, batch, 0, warp_on_device=True,
                                                    **kwargs),
        "now: host pair": pretext_dataset(files, batch, 0, **kwargs),
        "other pixels: window + area resize": per_file(area),
    }


def area_crop(contents, seed):
    """The crop's region of the window resized with ``method="area"`` (float 0-255, no flip):
    the cheaper resize that `area_pixel_difference` compares with the protocol's."""
    import tensorflow as tf

    from aetv2_tf.data.augment import _crop_plan

    scale, offset, _, lo, hi = _crop_plan(tf.image.extract_jpeg_shape(contents)[:2], seed, 224,
                                          True)
    window = tf.io.decode_and_crop_jpeg(contents, tf.concat([lo, hi - lo], 0), channels=3)
    top = tf.cast(tf.round(tf.cast(offset, tf.float32) / scale), tf.int32) - lo
    size = tf.cast(tf.round(224 / scale), tf.int32)
    region = window[top[0]:top[0] + size[0], top[1]:top[1] + size[1]]
    return tf.image.resize(region, [224, 224], method="area")


def area_pixel_difference(files, count: int = 32) -> float:
    """Mean |area crop - protocol crop| in 0-255 units over ``count`` files (flip undone)."""
    import numpy as np
    import tensorflow as tf

    from aetv2_tf.data.augment import _crop_plan, decode_resize_crop

    diffs = []
    for k, path in enumerate(files.paths[:count]):
        contents, seed = tf.io.read_file(path), tf.constant([k, 1], tf.int64)
        exact = decode_resize_crop(contents, seed, 224, True) * 255.0
        flip = _crop_plan(tf.image.extract_jpeg_shape(contents)[:2], seed, 224, True)[2]
        exact = tf.reverse(exact, [1]) if bool(flip) else exact
        diffs.append(np.abs(exact.numpy() - area_crop(contents, seed).numpy()).mean())
    return float(np.mean(diffs))


def main() -> None:
    common.keras_quiet()
    parser = common.parser(__doc__)
    parser.add_argument("--root", default="/tmp/aetv2_photo_folder",
                        help="An ImageNet-like folder; made (--per_class per class) if missing.")
    parser.add_argument("--per_class", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=8, help="Batches per round and config.")
    parser.add_argument("--repeats", type=int, default=3, help="Interleaved rounds.")
    parser.add_argument("--rest", type=float, default=0.5,
                        help="Seconds of rest after each iterator (module docstring).")
    parser.add_argument("--pairs_per_accelerator_second", type=float,
                        default=H200_ALEXNET_PAIRS_PER_S)
    args = parser.parse_args()
    common.configure_threads(args)
    load_before = common.load_average()
    from concurrent.futures import ThreadPoolExecutor

    from aetv2_tf.data.sources import list_image_folder
    from aetv2_tf.data.stream import FileBatches
    from benchmarks.make_folder import write_cifar10_folder

    if not pathlib.Path(args.root, "train").exists():
        write_cifar10_folder(args.root, train_per_class=args.per_class, val_per_class=0,
                             photo=True)
    files = list_image_folder(args.root, "train")
    kb = sum(pathlib.Path(p).stat().st_size for p in files.paths) / len(files.paths) / 1024
    b, n = args.batch, args.batches
    def drain(ds, count: int) -> float:
        """CPU seconds to read `count` batches from a fresh iterator (then deleted, rested)."""
        c0 = time.process_time()
        for _ in ds.take(count):
            pass
        used = time.process_time() - c0
        time.sleep(args.rest)
        return used

    runs = {name: lambda ds=ds: drain(ds, n + 2) - drain(ds, 2)
            for name, ds in pipelines(files, b).items()}
    for run in runs.values():
        run()  # warm-up: the functions' first runs
    pillow = FileBatches(files, b, 0, 0, 10**9, size=224)
    pool = ThreadPoolExecutor(1)
    steps = iter(range(10**9))

    def pillow_run() -> float:
        c0 = time.process_time()
        list(pool.map(pillow.batch, [next(steps) for _ in range(n)]))
        return time.process_time() - c0

    runs["Pillow reader, 1 thread"] = pillow_run
    timings = {name: [] for name in runs}
    names = list(runs)
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            timings[name].append(common.Timing(0.0, runs[name]()))
    images = n * b
    rate = {name: common.median(images / t.cpu for t in ts) for name, ts in timings.items()}
    limit = rate["decode (the limit)"]
    rows = [(name, f"{rate[name]:,.0f}", f"{1000 / rate[name]:.2f}",
             f"{rate[name] / limit:.0%}", common.spread([images / t.cpu for t in ts]))
            for name, ts in timings.items()]
    table = common.markdown_table(
        ("stage", "images (pairs) per CPU-s", "CPU ms each", "of decode", "spread"), rows)
    accel = args.pairs_per_accelerator_second
    notes = [f"Folder: {len(files.paths)} files of {kb:.0f} KB ({args.root}); batch {b}, "
             f"{n} batches x {args.repeats} interleaved rounds per row.",
             f"The area resize's crops differ from the protocol's by "
             f"{area_pixel_difference(files):.1f} / 255 per pixel on average (32 files).",
             "Cores one accelerator needs at {:,.0f} pairs/s: {}.".format(accel, ", ".join(
                 f"{name} {accel / rate[name]:.0f}" for name in
                 ("before: host pair", "now: host pair", "now: crop for the device",
                  "decode (the limit)")))]
    common.report("ImageNet-size input (benchmarks.imagenet_input)", table, args, notes,
                  load_before)


if __name__ == "__main__":
    main()
