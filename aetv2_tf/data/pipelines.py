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
(`models.pretext.WarpPairs`, ``--warp``). `from_data_service` runs a pipeline on a tf.data
service (``--data_service``) with the same batches. The batches of images come from
`data.batches`. All randomness is stateless, derived from ``(seed, batch index)`` or ``(seed,
element index)``; shuffling uses a seeded ``shuffle``; parallel maps keep their order. So two
pipelines built with the same seed yield identical batches (the seeded ``shuffle`` also depends
on TensorFlow's global seed, if one is set: keep that equal too). Images are ``float32`` in
``[0, 1]`` until the final :func:`normalize`.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from aetv2_tf.data.augment import (  # noqa: F401 - re-exported
    decode_resize_crop,
    pad_crop_flip,
    resize_crop,
    resize_shorter_side,
    to_float,
)
from aetv2_tf.data.batches import SALT_BATCH, enumerated_batches, stream_seed
from aetv2_tf.data.constants import (  # noqa: F401 - re-exported
    AETV1_FILL,
    CIFAR10_MEAN,
    CIFAR10_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    normalization_constants,
)
from aetv2_tf.data.homographies import sample_homographies, warp
from aetv2_tf.method.geometry import matrix_to_params

AUTOTUNE = tf.data.AUTOTUNE
# Every function given to `Dataset.map` here is traced as written
# (`tf.autograph.experimental.do_not_convert`, as in `data.batches`).


def normalize(images, mean: Sequence[float] = CIFAR10_MEAN,
              std: Sequence[float] = CIFAR10_STD) -> tf.Tensor:
    """``(x - mean) / std`` per channel, (..., 3) -> float32; uint8 is first divided by 255."""
    x = to_float(images)
    return (x - tf.constant(mean, tf.float32)) / tf.constant(std, tf.float32)


def _options(ds: tf.data.Dataset) -> tf.data.Dataset:
    """Deterministic; split across workers by DATA (each computes the global batch and keeps
    its part: the same pairs as on one machine; FILE sharding of tensorflow-datasets records
    would give the workers the same crop and homography seeds)."""
    options = tf.data.Options()
    options.deterministic = True
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(options)


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
    ds = enumerated_batches(images_or_dataset, None, batch_size, seed, training=training,
                            augment=augment, image_size=image_size, repeat=repeat,
                            drop_remainder=drop_remainder, shuffle_buffer=shuffle_buffer,
                            start_step=start_step, shard=shard,
                            dtype=tf.uint8 if warp_on_device else tf.float32)
    make_pairs = _pairs(seed, batch_size, image_size, shift, shard, warp_on_device, fill_value,
                        mean, std, with_rotation)
    return _options(ds.map(make_pairs, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE))


def _pairs(seed, batch_size: int, image_size: int, shift: str, shard: tuple[int, int],
           warp_on_device: bool, fill_value: float, mean, std, with_rotation: bool):
    """The map ``(i, (x, labels)) -> (pair, params)`` of `pretext_dataset` (its arguments):
    batch ``i``'s homographies drawn with the seed of ``i`` for the whole global batch and
    sliced to this shard's rows, then the warp here or the uint8 crops and T for the device."""
    batch_seed = stream_seed(seed, SALT_BATCH)
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

    return make_pairs


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
    start_step: int = 0,
) -> tf.data.Dataset:
    """Batches ``(x, label)`` for the probes: x (B, S, S, 3) float32 normalised, label (B,) int64.

    ``images``/``labels``: numpy (N, S, S, 3) uint8 and (N,) ints, or a ``tf.data.Dataset`` of
    (image, label) with ``labels=None``. Training shuffles (seeded) and, if ``augment``, crops and
    flips (ImageNet: resize 256, random crop 224, flip); evaluation keeps the order and does not
    augment (ImageNet: resize 256, centre crop 224). ``repeat``: an endless stream from the
    global batch ``start_step`` on (`batches.enumerated_batches`: of arrays, epoch after epoch
    of ``ceil(N / B)`` batches without ``drop_remainder``, exact on resume).
    """
    ds = enumerated_batches(images, labels, batch_size, seed, training=training,
                            augment=training and augment, image_size=image_size, repeat=repeat,
                            drop_remainder=drop_remainder, shuffle_buffer=shuffle_buffer,
                            start_step=start_step)
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
    ds = enumerated_batches(images_or_dataset, None, batch_size // 4, seed, training=True,
                            augment=augment, image_size=image_size, repeat=True,
                            drop_remainder=True, shuffle_buffer=None, start_step=start_step,
                            shard=shard)

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
