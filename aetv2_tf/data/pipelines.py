"""tf.data pipelines: AET pretext pairs and classification batches, deterministic under a seed.

Two image protocols:

* fixed size (CIFAR-10, ``image_size`` equal to the images' size): whole batches are gathered,
  then augmented in one op each (random crop with ``image_size // 8`` = 4 px zero padding and a
  horizontal flip, as AETv1);
* variable size (ImageNet/Places, ``image_size=224``): each image is resized so that its shorter
  side is ``round(image_size * 256 / 224)`` = 256, then randomly cropped to 224 and flipped
  (training) or centre-cropped (evaluation), before batching; only the crop's window is resized,
  and a training file list's JPEGs are decoded only there (`augment.decode_resize_crop`: the
  same pixels at a fraction of the CPU time, BENCHMARKS.md "ImageNet-size input").

Homographies are sampled and applied per batch (``map`` after ``batch``); with
``warp_on_device`` the pipeline sends uint8 crops and the homographies, and the model warps
(`models.pretext.WarpPairs`, ``--warp``). `from_data_service` runs a pipeline on a tf.data service
(``--data_service``) with the same batches. All randomness is
stateless, derived from ``(seed, batch index)`` or ``(seed, element index)``; shuffling uses a
seeded ``shuffle``; parallel maps keep their order. So two pipelines built with the same seed yield
identical batches (the seeded ``shuffle`` also depends on TensorFlow's global seed, if one is set:
keep that equal too). Images are ``float32`` in ``[0, 1]`` until the final :func:`normalize`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from aetv2_tf.data.augment import (  # noqa: F401 - re-exported
    decode_resize_crop,
    pad_crop_flip,
    resize_crop,
    resize_shorter_side,
    to_float,
)
from aetv2_tf.data.constants import (  # noqa: F401 - re-exported
    AETV1_FILL,
    CIFAR10_MEAN,
    CIFAR10_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    normalization_constants,
)
from aetv2_tf.data.crops import crops
from aetv2_tf.data.homographies import sample_homographies, warp
from aetv2_tf.data.image_folders import ImageFiles, decode_image_file
from aetv2_tf.method.geometry import matrix_to_params

AUTOTUNE = tf.data.AUTOTUNE
# Every function given to `Dataset.map` / `flat_map` here is traced as written
# (`tf.autograph.experimental.do_not_convert`): none has Python control flow on tensors, and
# autograph's source conversion cost each process about a CPU-second at start-up.
_DATASET_SHUFFLE_BUFFER = 1024  # elements: crops of variable-size images (`crops`)
_SALT_SHUFFLE, _SALT_ELEMENT, _SALT_BATCH = 1, 2, 3


def normalize(images, mean: Sequence[float] = CIFAR10_MEAN,
              std: Sequence[float] = CIFAR10_STD) -> tf.Tensor:
    """``(x - mean) / std`` per channel, (..., 3) -> float32; uint8 is first divided by 255."""
    x = to_float(images)
    return (x - tf.constant(mean, tf.float32)) / tf.constant(std, tf.float32)


def _seed_pair(seed) -> tf.Tensor:
    """An int or an (int, int) pair -> a stateless seed (2,) int64."""
    pair = (int(seed), 0) if np.ndim(seed) == 0 else tuple(int(s) for s in seed)
    return tf.constant(pair, tf.int64)


def _stream_seed(seed, salt: int) -> tf.Tensor:
    return tf.random.experimental.stateless_fold_in(_seed_pair(seed), salt)


def _shuffle_seed(seed) -> int:
    a, b = (int(seed), 0) if np.ndim(seed) == 0 else tuple(int(s) for s in seed)
    return (a * 1_000_003 + b * 7919 + 12345) % (2**31 - 1)


def _options(ds: tf.data.Dataset) -> tf.data.Dataset:
    """Deterministic; split across workers by DATA (each computes the global batch and keeps
    its part: the same pairs as on one machine; FILE sharding of tensorflow-datasets records
    would give the workers the same crop and homography seeds)."""
    options = tf.data.Options()
    options.deterministic = True
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(options)


# --------------------------------------------------------------------------------- the sources
def _epoch_batches(n: int, batch_size: int, seed, start_step: int) -> tf.data.Dataset:
    """Global batch index i -> the (B,) example indices of batch i, from batch `start_step` on.

    Epoch ``e = i // (n // B)`` visits a permutation seeded by ``(seed, e)``, drawn once per
    epoch, so batch i is a pure function of (seed, i): a run resumed at step i sees exactly the
    batches it would have seen (the skip into the first epoch reads no data).
    """
    per_epoch = n // batch_size
    if per_epoch < 1:
        raise ValueError(f"batch_size {batch_size} exceeds the {n} training images")
    shuffle_seed = _stream_seed(seed, _SALT_SHUFFLE)
    first = start_step // per_epoch

    @tf.autograph.experimental.do_not_convert
    def epoch(e):
        order = tf.argsort(tf.random.stateless_uniform(
            [n], tf.random.experimental.stateless_fold_in(shuffle_seed, e)))
        return tf.data.Dataset.from_tensor_slices(
            tf.reshape(order[:per_epoch * batch_size], [per_epoch, batch_size]))

    return tf.data.Dataset.range(first, 2**62).flat_map(epoch).skip(
        start_step - first * per_epoch)


def _file_batches(files: ImageFiles, batch_size: int, seed, *, augment: bool, image_size: int,
                  start_step: int, shard: tuple[int, int] = (0, 1),
                  dtype: tf.DType = tf.float32) -> tf.data.Dataset:
    """Enumerated training batches ``(i, (images (b, S, S, 3), labels (b,)))`` of a checked file
    list: the WHOLE list permuted every epoch (`_epoch_batches`, seeded, exact on resume), each
    file's crop decoded and resized (`decode_resize_crop`: only the crop's window of a JPEG) with
    the seed of its global element index ``i * B + j`` (224 protocol: random crop and flip if
    ``augment``, else the centre crop). ``dtype``: float32 in [0, 1], or uint8 (rounded).

    ``shard=(w, W)``: worker w of W reads only elements ``w b .. (w + 1) b - 1`` of each global
    batch of ``B = batch_size`` (``b = B / W``): the W shards of a step are the step's batch of
    one worker, split, and no file is read twice."""
    paths, labels = tf.constant(files.paths), tf.constant(files.labels)
    element_seed = _stream_seed(seed, _SALT_ELEMENT)
    worker, workers = shard
    if batch_size % workers:
        raise ValueError(f"{batch_size} images a step do not split over {workers} workers")
    b = batch_size // workers

    @tf.autograph.experimental.do_not_convert
    def elements(i, idx):
        first = worker * b
        return i * batch_size + first + tf.range(b, dtype=tf.int64), idx[first:first + b]

    @tf.autograph.experimental.do_not_convert
    def load(g, k):
        s = tf.random.experimental.stateless_fold_in(element_seed, g)
        contents = tf.io.read_file(tf.gather(paths, k))
        return decode_resize_crop(contents, s, image_size, augment, dtype), tf.gather(labels, k)

    ds = tf.data.Dataset.zip(tf.data.Dataset.range(start_step, 2**62),
                             _epoch_batches(len(files.paths), batch_size, seed, start_step))
    ds = ds.map(elements).unbatch().map(load, num_parallel_calls=AUTOTUNE)
    return ds.batch(b, drop_remainder=True).enumerate(start_step)


def _batches(images, labels, batch_size: int, seed, *, training: bool, augment: bool,
             image_size: int, repeat: bool, drop_remainder: bool,
             shuffle_buffer: int | None, start_step: int = 0,
             shard: tuple[int, int] = (0, 1), dtype: tf.DType = tf.float32) -> tf.data.Dataset:
    """Enumerated batches ``(i, (float32 [0, 1] images (B, S, S, 3), labels (B,) int64))``.

    ``training`` shuffles; ``augment`` crops and flips (variable-size images: random crop of the
    resized image if ``augment``, else its centre crop). ``i`` is the global batch index, starting
    at ``start_step``; training streams (``training`` and ``repeat``) of in-memory images and of
    file lists (`ImageFiles`) are pure functions of it (exact resume); streamed datasets
    (tensorflow-datasets) are reshuffled with a seed that folds in start_step. ``dtype=uint8``
    lets a training file list's images stay uint8 (others are float32 whatever it says).
    """
    if shard != (0, 1) and not (isinstance(images, ImageFiles) and training and repeat):
        raise ValueError("only the training stream of a file list is sharded by worker")
    if isinstance(images, ImageFiles):
        if training and repeat:
            return _file_batches(images, batch_size, seed, augment=augment,
                                 image_size=image_size, start_step=start_step, shard=shard,
                                 dtype=dtype)
        ds = tf.data.Dataset.from_tensor_slices((images.paths, images.labels))
        if training:  # the whole (class-sorted) list, before decoding: no buffer of images
            ds = ds.shuffle(len(images.paths), seed=_shuffle_seed(seed),
                            reshuffle_each_iteration=True)
        images = ds.map(tf.autograph.experimental.do_not_convert(decode_image_file),
                        num_parallel_calls=AUTOTUNE)
    if isinstance(images, tf.data.Dataset):
        if labels is not None:
            raise ValueError("pass labels inside the dataset, not separately")
        ds = images.map(tf.autograph.experimental.do_not_convert(_image_label),
                        num_parallel_calls=AUTOTUNE)
        buffer = shuffle_buffer or _DATASET_SHUFFLE_BUFFER
        fixed = list(ds.element_spec[0].shape) == [image_size, image_size, 3]
        if not fixed:  # variable size: resize and crop each image, shuffle the crops, batch
            return crops(ds, _stream_seed(seed, _SALT_ELEMENT), _shuffle_seed(seed) + start_step,
                         image_size=image_size, augment=augment, training=training,
                         repeat=repeat, buffer=buffer).batch(
                batch_size, drop_remainder=drop_remainder).enumerate(start_step)
        if training:
            ds = ds.shuffle(buffer, seed=_shuffle_seed(seed) + start_step,
                            reshuffle_each_iteration=True)
        if repeat:
            ds = ds.repeat()
        ds = ds.batch(batch_size, drop_remainder=drop_remainder)
        ds = ds.map(tf.autograph.experimental.do_not_convert(lambda x, y: (to_float(x), y)),
                    num_parallel_calls=AUTOTUNE)
    else:
        images = np.asarray(images)
        if images.ndim != 4 or images.shape[1:] != (image_size, image_size, 3):
            raise ValueError(
                f"images must be (N, {image_size}, {image_size}, 3), got {images.shape}; pass a "
                f"tf.data.Dataset for images of other sizes"
            )
        n = len(images)
        labels = np.zeros(n, np.int64) if labels is None else np.asarray(labels, np.int64)
        if labels.shape != (n,):
            raise ValueError(f"labels must be ({n},), got {labels.shape}")
        images_t, labels_t = tf.constant(images), tf.constant(labels)
        if training and repeat:
            ds = _epoch_batches(n, batch_size, seed, start_step)
        else:
            ds = tf.data.Dataset.range(n)
            if training:
                ds = ds.shuffle(shuffle_buffer or n, seed=_shuffle_seed(seed),
                                reshuffle_each_iteration=True)
            if repeat:
                ds = ds.repeat()
            ds = ds.batch(batch_size, drop_remainder=drop_remainder)
        ds = ds.map(tf.autograph.experimental.do_not_convert(
            lambda idx: (to_float(tf.gather(images_t, idx)), tf.gather(labels_t, idx))),
            num_parallel_calls=AUTOTUNE)
    ds = ds.enumerate(start_step)
    if augment:
        aug_seed = _stream_seed(seed, _SALT_ELEMENT)

        @tf.autograph.experimental.do_not_convert
        def augment_batch(i, batch):
            x, y = batch
            s = tf.random.experimental.stateless_fold_in(aug_seed, i)
            return i, (pad_crop_flip(x, s, image_size // 8), y)

        ds = ds.map(augment_batch, num_parallel_calls=AUTOTUNE)
    return ds


def _image_label(*element):
    """A dataset element -> (image, label): (image, label) tuples, dicts or bare images."""
    if len(element) == 1:
        element = element[0]
        if isinstance(element, dict):
            return element["image"], tf.cast(element.get("label", tf.constant(0)), tf.int64)
        return element, tf.constant(0, tf.int64)
    return element[0], tf.cast(element[1], tf.int64)


# ------------------------------------------------------------------------------- the pipelines
def pretext_dataset(
    images_or_dataset,
    batch_size: int,
    seed,
    *,
    training: bool = True,
    augment: bool = True,
    shift: str = "integer",
    image_size: int = 32,
    fill_value: float = AETV1_FILL,
    repeat: bool = True,
    drop_remainder: bool = True,
    mean: Sequence[float] = CIFAR10_MEAN,
    std: Sequence[float] = CIFAR10_STD,
    shuffle_buffer: int | None = None,
    with_rotation: bool = False,
    start_step: int = 0,
    shard: tuple[int, int] = (0, 1),
    warp_on_device: bool = False,
) -> tf.data.Dataset:
    """AET training pairs: a dataset of ``((x, tx), params)``.

    Args:
      images_or_dataset: uint8 images (N, S, S, 3) as numpy, a checked file list
        (`aetv2_tf.data.image_folders.ImageFiles`, from a folder source), or a ``tf.data.Dataset``
        of (image, label) / images of any size (variable-size images use the ImageNet protocol).
      batch_size: B. seed: an int (or a pair of ints); equal seeds give identical batches.
      training: shuffle (seeded). augment: pre-augment x (crop + flip; ImageNet: random crop of the
        resized image, else its centre crop).
      shift: ``"integer"`` (AETv1) or ``"continuous"`` corner shifts (homographies.py).
      fill_value: grey for pixels of t(x) that come from outside x, in [0, 1] before
        normalisation (default AETv1's 128/255).
      start_step: the first global batch index: a run resumed at step s passes s and continues
        the stream of batches (order, crops, homographies) exactly where it stopped.
      shard: ``(w, W)``, worker w of W (a file list only): this worker's ``B / W`` pairs of each
        global batch of ``batch_size`` pairs, images, crops and homographies exactly those
        rows of the one-worker batch (the B homographies are drawn, then sliced).

      warp_on_device: the pair is made by the model (`models.pretext.WarpPairs`), on the
        accelerator: the dataset yields ``((x uint8 (B, S, S, 3), T (B, 3, 3) float32),
        params)``, x the augmented image rounded to uint8 (a quarter of float32's bytes to the
        device), the same ``T`` and ``params`` as the host pairs; the CPU does no warp.

    Yields ``x``, ``tx``: (B, S, S, 3) float32 normalised with (mean, std); ``params``: (B, 8)
    float32, the 8 parameters (conventions.md) of the model-frame ``T`` with ``tx = t(x)``.
    With ``with_rotation=True`` the target is ``(params, k)``, k (B,) int32 quarter turns.
    """
    ds = _batches(images_or_dataset, None, batch_size, seed, training=training, augment=augment,
                  image_size=image_size, repeat=repeat, drop_remainder=drop_remainder,
                  shuffle_buffer=shuffle_buffer, start_step=start_step, shard=shard,
                  dtype=tf.uint8 if warp_on_device else tf.float32)
    batch_seed = _stream_seed(seed, _SALT_BATCH)
    rows = shard[0] * (batch_size // shard[1])  # this shard's first row of the global batch

    @tf.autograph.experimental.do_not_convert
    def make_pairs(i, batch):
        x = batch[0]
        s = tf.random.experimental.stateless_fold_in(batch_seed, i)
        n = tf.shape(x)[0]
        t, k = sample_homographies(n if shard == (0, 1) else batch_size, image_size, image_size,
                                   s, shift, return_rotation=True)
        t, k = t[rows:rows + n], k[rows:rows + n]
        params = matrix_to_params(t)
        if warp_on_device:
            if x.dtype != tf.uint8:  # float [0, 1]: arrays are exact, resized images round
                x = tf.cast(tf.round(tf.clip_by_value(x, 0.0, 1.0) * 255.0), tf.uint8)
            pair = (x, tf.cast(t, tf.float32))
        else:
            tx = warp(x, t, fill_value=fill_value)
            pair = (normalize(x, mean, std), normalize(tx, mean, std))
        return (pair, (params, k)) if with_rotation else (pair, params)

    ds = ds.map(make_pairs, num_parallel_calls=AUTOTUNE)
    return _options(ds.prefetch(AUTOTUNE))


def classification_dataset(
    images,
    labels,
    batch_size: int,
    seed,
    *,
    training: bool,
    augment: bool = True,
    image_size: int = 32,
    repeat: bool = False,
    drop_remainder: bool = False,
    mean: Sequence[float] = CIFAR10_MEAN,
    std: Sequence[float] = CIFAR10_STD,
    shuffle_buffer: int | None = None,
) -> tf.data.Dataset:
    """Batches ``(x, label)`` for the probes: x (B, S, S, 3) float32 normalised, label (B,) int64.

    ``images``/``labels``: numpy (N, S, S, 3) uint8 and (N,) ints, or a ``tf.data.Dataset`` of
    (image, label) with ``labels=None``. Training shuffles (seeded) and, if ``augment``, crops and
    flips (ImageNet: resize 256, random crop 224, flip); evaluation keeps the order and does not
    augment (ImageNet: resize 256, centre crop 224).
    """
    ds = _batches(images, labels, batch_size, seed, training=training,
                  augment=training and augment,
                  image_size=image_size, repeat=repeat, drop_remainder=drop_remainder,
                  shuffle_buffer=shuffle_buffer)
    ds = ds.map(tf.autograph.experimental.do_not_convert(
        lambda i, batch: (normalize(batch[0], mean, std), batch[1])), num_parallel_calls=AUTOTUNE)
    return _options(ds.prefetch(AUTOTUNE))


def rotation_dataset(
    images_or_dataset,
    batch_size: int,
    seed,
    *,
    augment: bool = True,
    image_size: int = 32,
    mean: Sequence[float] = CIFAR10_MEAN,
    std: Sequence[float] = CIFAR10_STD,
    start_step: int = 0,
    shard: tuple[int, int] = (0, 1),
) -> tf.data.Dataset:
    """RotNet pretext batches ``(x, k)``: each of ``batch_size // 4`` images in all 4 rotations
    (``shard``: as `pretext_dataset`, this worker's images of the global batch).

    x (batch_size, S, S, 3) float32 normalised; k (batch_size,) int32, the counter-clockwise
    quarter turns (``np.rot90(image, k)``), as RotNet trains on all four rotations at once.
    """
    if batch_size % 4:
        raise ValueError(f"the rotation pretext needs a batch size divisible by 4: {batch_size}")
    ds = _batches(images_or_dataset, None, batch_size // 4, seed, training=True,
                  augment=augment, image_size=image_size, repeat=True, drop_remainder=True,
                  shuffle_buffer=None, start_step=start_step, shard=shard)

    @tf.autograph.experimental.do_not_convert
    def rotations(i, batch):
        x = normalize(batch[0], mean, std)
        rotated = tf.concat([tf.image.rot90(x, k) for k in range(4)], axis=0)
        labels = tf.repeat(tf.range(4, dtype=tf.int32), tf.shape(x)[0])
        return rotated, labels

    return _options(ds.map(rotations, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE))


def from_data_service(dataset: tf.data.Dataset, service: str) -> tf.data.Dataset:
    """``dataset`` computed by a tf.data service (``service``: the dispatcher's
    ``grpc://host:port``) instead of this process: the training process only receives the
    batches. Each call is its own job (``ShardingPolicy.OFF``: one worker produces the whole
    stream, in order), so the batches, and a resumed run's, are exactly the local ones, provided
    the dispatcher has exactly one worker: with ShardingPolicy.OFF every worker serves every job,
    so a second worker would send each batch twice, in no fixed order. One dispatcher and one
    worker per training process.

    Start a dispatcher and a worker on the input machine with TensorFlow's servers
    (``tf.data.experimental.service.DispatchServer`` / ``WorkerServer``; BUILD.md)."""
    return dataset.apply(tf.data.experimental.service.distribute(
        processing_mode=tf.data.experimental.service.ShardingPolicy.OFF, service=service))
