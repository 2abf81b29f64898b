"""tf.data pipelines: AET pretext pairs and classification batches, deterministic under a seed.

The batches of images come from `data.batches`: fixed-size images (CIFAR-10) augmented per batch
(a random crop of the image zero-padded by ``image_size // 8`` px and a horizontal flip, as
AETv1), variable-size images (ImageNet/Places) by the 224-pixel protocol (shorter side
resized to ``round(image_size * 256 / 224)``, a random crop and flip, or the centre crop).
Homographies are sampled and applied per batch; with ``warp_on_device`` the pipeline sends
uint8 crops and the homographies, and the model warps (`models.pretext.WarpPairs`). All
randomness is stateless, derived from ``(seed, batch index)`` or ``(seed, element index)``, and
parallel maps keep their order: equal seeds give identical batches (the seeded ``shuffle`` also
depends on TensorFlow's global seed, if one is set). Images are float32 in ``[0, 1]`` until
:func:`normalize`.
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
# Every function given to `Dataset.map` is traced as written (`do_not_convert`: `data.batches`).


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


def pretext_dataset(images_or_dataset, batch_size: int, seed, *, training: bool = True,
                    augment: bool = True, shift: str = "integer", image_size: int = 32,
                    fill_value: float = AETV1_FILL, repeat: bool = True,
                    drop_remainder: bool = True, mean: Sequence[float] = CIFAR10_MEAN,
                    std: Sequence[float] = CIFAR10_STD, shuffle_buffer: int | None = None,
                    with_rotation: bool = False, start_step: int = 0,
                    shard: tuple[int, int] = (0, 1),
                    warp_on_device: bool = False) -> tf.data.Dataset:
    """AET training pairs: a dataset of ``((x, tx), params)``.

    ``images_or_dataset``: uint8 images (N, S, S, 3) as numpy, a checked file list
    (`data.image_folders.ImageFiles`), or a ``tf.data.Dataset`` of (image, label) / images of
    any size. ``seed``: an int or a pair; equal seeds give identical batches. ``training``
    shuffles; ``augment`` crops and flips x; ``shift``: ``"integer"`` (AETv1) or
    ``"continuous"`` corner shifts; ``fill_value``: the grey of t(x) outside x, in [0, 1].
    ``start_step``: the first global batch index (a resumed run continues the stream exactly).
    ``shard=(w, W)`` (a file list only): worker w's ``B / W`` rows of each global batch.
    ``warp_on_device``: yields ``((x uint8 (B, S, S, 3), T (B, 3, 3) float32), params)``, the
    same ``T`` and ``params``, for the model to warp (`models.pretext.WarpPairs`).

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


def classification_dataset(images, labels, batch_size: int, seed, *, training: bool,
                           augment: bool = True, image_size: int = 32, repeat: bool = False,
                           drop_remainder: bool = False, mean: Sequence[float] = CIFAR10_MEAN,
                           std: Sequence[float] = CIFAR10_STD, shuffle_buffer: int | None = None,
                           start_step: int = 0) -> tf.data.Dataset:
    """Batches ``(x, label)`` for the probes: x (B, S, S, 3) float32 normalised, label (B,) int64,
    of numpy (N, S, S, 3) uint8 images and (N,) labels, or of a ``tf.data.Dataset`` of (image,
    label) with ``labels=None``. Training shuffles (seeded) and, if ``augment``, crops and flips;
    evaluation keeps the order (variable-size images: their centre crop). ``repeat``: an endless
    stream from the global batch ``start_step`` on (of arrays: exact on resume)."""
    ds = enumerated_batches(images, labels, batch_size, seed, training=training,
                            augment=training and augment, image_size=image_size, repeat=repeat,
                            drop_remainder=drop_remainder, shuffle_buffer=shuffle_buffer,
                            start_step=start_step)
    ds = ds.map(tf.autograph.experimental.do_not_convert(
        lambda i, batch: (normalize(batch[0], mean, std), batch[1])), num_parallel_calls=AUTOTUNE)
    return _options(ds.prefetch(AUTOTUNE))


def rotation_dataset(images_or_dataset, batch_size: int, seed, *, augment: bool = True,
                     image_size: int = 32, mean: Sequence[float] = CIFAR10_MEAN,
                     std: Sequence[float] = CIFAR10_STD, start_step: int = 0,
                     shard: tuple[int, int] = (0, 1)) -> tf.data.Dataset:
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
    ``grpc://host:port``; BUILD.md) instead of this process. ``ShardingPolicy.OFF``: one worker
    produces the whole stream in order, so the batches (and a resumed run's) are exactly the
    local ones, provided the dispatcher has exactly ONE worker (every worker serves every job:
    a second one would send each batch twice, in no fixed order)."""
    return dataset.apply(tf.data.experimental.service.distribute(
        processing_mode=tf.data.experimental.service.ShardingPolicy.OFF, service=service))
