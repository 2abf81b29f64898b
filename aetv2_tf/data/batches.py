"""Enumerated batches of uint8-or-float images and labels from any source, deterministic under
a seed: what `data.pipelines` makes AET pairs, RotNet turns and probe batches of.

Sources: uint8 arrays ``(N, S, S, 3)`` (whole batches gathered, then augmented in one op each),
checked file lists (`image_folders.ImageFiles`) and ``tf.data.Dataset`` s of ``(image, label)``
(variable size: `crops`). Every draw is stateless, from ``(seed, batch index)`` or ``(seed,
element index)`` through `stream_seed` and a salt per stream; shuffles use a seeded ``shuffle``.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from aetv2_tf.data.augment import decode_resize_crop, pad_crop_flip, to_float
from aetv2_tf.data.crops import crops
from aetv2_tf.data.image_folders import ImageFiles, decode_image_file

AUTOTUNE = tf.data.AUTOTUNE
# Every function given to `Dataset.map` / `flat_map` is traced as written (`do_not_convert`):
# none has Python control flow on tensors, and autograph cost a CPU-second at start-up.
_DATASET_SHUFFLE_BUFFER = 1024  # elements: crops of variable-size images (`crops`)
#: The salts of the streams of draws: the shuffle, each element's crop, each batch's pairs.
SALT_SHUFFLE, SALT_ELEMENT, SALT_BATCH = 1, 2, 3


def _seed_pair(seed) -> tuple[int, int]:
    """An int or an (int, int) pair -> the pair."""
    return (int(seed), 0) if np.ndim(seed) == 0 else tuple(int(s) for s in seed)


def stream_seed(seed, salt: int) -> tf.Tensor:
    """The stateless seed (2,) of the stream ``salt`` (`SALT_SHUFFLE`, ...) of ``seed``."""
    return tf.random.experimental.stateless_fold_in(tf.constant(_seed_pair(seed), tf.int64), salt)


def _shuffle_seed(seed) -> int:
    """The int seed of a ``Dataset.shuffle`` of ``seed`` (an int or an (int, int) pair)."""
    a, b = _seed_pair(seed)
    return (a * 1_000_003 + b * 7919 + 12345) % (2**31 - 1)


def _epoch_batches(n: int, batch_size: int, seed, start_step: int,
                   drop_remainder: bool = True) -> tf.data.Dataset:
    """Global batch index i -> the (B,) example indices of batch i, from batch `start_step` on.

    Epoch ``e = i // (n // B)`` visits a permutation seeded by ``(seed, e)``, drawn once per
    epoch, so batch i is a pure function of (seed, i): a run resumed at step i sees exactly the
    batches it would have seen (the skip into the first epoch reads no data). Without
    ``drop_remainder`` an epoch is ``ceil(n / B)`` batches, its last one short.
    """
    per_epoch = n // batch_size if drop_remainder else -(-n // batch_size)
    if per_epoch < 1:
        raise ValueError(f"batch_size {batch_size} exceeds the {n} training images")
    shuffle_seed = stream_seed(seed, SALT_SHUFFLE)
    first = start_step // per_epoch

    @tf.autograph.experimental.do_not_convert
    def epoch(e):
        order = tf.argsort(tf.random.stateless_uniform(
            [n], tf.random.experimental.stateless_fold_in(shuffle_seed, e)))
        if not drop_remainder:
            return tf.data.Dataset.from_tensor_slices(order).batch(batch_size)
        return tf.data.Dataset.from_tensor_slices(
            tf.reshape(order[:per_epoch * batch_size], [per_epoch, batch_size]))

    return tf.data.Dataset.range(first, 2**62).flat_map(epoch).skip(
        start_step - first * per_epoch)


def _file_batches(files: ImageFiles, batch_size: int, seed, *, augment: bool, image_size: int,
                  start_step: int, shard: tuple[int, int] = (0, 1),
                  dtype: tf.DType = tf.float32) -> tf.data.Dataset:
    """Enumerated training batches ``(i, (images (b, S, S, 3), labels (b,)))`` of a checked file
    list, permuted whole every epoch (`_epoch_batches`), each file's crop decoded
    (`decode_resize_crop`) with the seed of its global element index ``i * B + j``; ``dtype``:
    float32 in [0, 1], or uint8 (rounded). ``shard=(w, W)``: worker w of W reads only elements
    ``w b .. (w + 1) b - 1`` of each global batch of ``B = batch_size`` (``b = B / W``)."""
    paths, labels = tf.constant(files.paths), tf.constant(files.labels)
    element_seed = stream_seed(seed, SALT_ELEMENT)
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


def enumerated_batches(images, labels, batch_size: int, seed, *, training: bool, augment: bool,
                       image_size: int, repeat: bool, drop_remainder: bool,
                       shuffle_buffer: int | None, start_step: int = 0,
                       shard: tuple[int, int] = (0, 1),
                       dtype: tf.DType = tf.float32) -> tf.data.Dataset:
    """Enumerated batches ``(i, (float32 [0, 1] images (B, S, S, 3), labels (B,) int64))``.

    ``training`` shuffles; ``augment`` crops and flips (variable-size images: else the centre
    crop). ``i``, the global batch index from ``start_step``: training streams of in-memory
    images and file lists are pure functions of it (exact resume); datasets are reshuffled with
    a seed that folds it in. ``dtype=uint8`` keeps a training file list's images uint8.
    """
    if shard != (0, 1) and not (isinstance(images, ImageFiles) and training and repeat):
        raise ValueError("only the training stream of a file list is sharded by worker")
    order = dict(training=training, repeat=repeat, drop_remainder=drop_remainder)
    if isinstance(images, ImageFiles):
        if training and repeat:
            return _file_batches(images, batch_size, seed, augment=augment,
                                 image_size=image_size, start_step=start_step, shard=shard,
                                 dtype=dtype)
        images = _decoded_files(images, seed, training)
    if isinstance(images, tf.data.Dataset):
        if labels is not None:
            raise ValueError("pass labels inside the dataset, not separately")
        ds = images.map(tf.autograph.experimental.do_not_convert(_image_label),
                        num_parallel_calls=AUTOTUNE)
        buffer = shuffle_buffer or _DATASET_SHUFFLE_BUFFER
        if list(ds.element_spec[0].shape) != [image_size, image_size, 3]:
            # variable size: resize and crop each image, shuffle the crops, batch
            return crops(ds, stream_seed(seed, SALT_ELEMENT), _shuffle_seed(seed) + start_step,
                         image_size=image_size, augment=augment, training=training,
                         repeat=repeat, buffer=buffer).batch(
                batch_size, drop_remainder=drop_remainder).enumerate(start_step)
        ds = _dataset_batches(ds, batch_size, _shuffle_seed(seed) + start_step, buffer, **order)
    else:
        ds = _array_batches(images, labels, batch_size, seed, image_size, shuffle_buffer,
                            start_step, **order)
    ds = ds.enumerate(start_step)
    return _augmented(ds, seed, image_size) if augment else ds


def _decoded_files(files: ImageFiles, seed, training: bool) -> tf.data.Dataset:
    """``(image uint8 (h, w, 3), label)`` of a checked file list, in list order, or the whole
    (class-sorted) list shuffled before decoding if ``training``: no buffer of images."""
    ds = tf.data.Dataset.from_tensor_slices((files.paths, files.labels))
    if training:
        ds = ds.shuffle(len(files.paths), seed=_shuffle_seed(seed), reshuffle_each_iteration=True)
    return ds.map(tf.autograph.experimental.do_not_convert(decode_image_file),
                  num_parallel_calls=AUTOTUNE)


def _dataset_batches(ds: tf.data.Dataset, batch_size: int, shuffle_seed: int, buffer: int, *,
                     training: bool, repeat: bool, drop_remainder: bool) -> tf.data.Dataset:
    """Batches ``(float32 [0, 1] images (B, S, S, 3), labels)`` of a dataset of fixed-size
    ``(image, label)`` elements, shuffled through ``buffer`` if ``training``."""
    if training:
        ds = ds.shuffle(buffer, seed=shuffle_seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    return ds.map(tf.autograph.experimental.do_not_convert(lambda x, y: (to_float(x), y)),
                  num_parallel_calls=AUTOTUNE)


def _array_batches(images, labels, batch_size: int, seed, image_size: int,
                   shuffle_buffer: int | None, start_step: int, *, training: bool, repeat: bool,
                   drop_remainder: bool) -> tf.data.Dataset:
    """Batches ``(float32 [0, 1] images (B, S, S, 3), labels (B,) int64)`` of in-memory uint8
    images ``(N, S, S, 3)`` (labels: ``(N,)``, or None: zeros); a repeated training stream
    visits `_epoch_batches` (exact on resume; a short last batch per epoch without
    ``drop_remainder``)."""
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
        ds = _epoch_batches(n, batch_size, seed, start_step, drop_remainder)
    else:
        ds = tf.data.Dataset.range(n)
        if training:
            ds = ds.shuffle(shuffle_buffer or n, seed=_shuffle_seed(seed),
                            reshuffle_each_iteration=True)
        if repeat:
            ds = ds.repeat()
        ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    return ds.map(tf.autograph.experimental.do_not_convert(
        lambda idx: (to_float(tf.gather(images_t, idx)), tf.gather(labels_t, idx))),
        num_parallel_calls=AUTOTUNE)


def _augmented(ds: tf.data.Dataset, seed, image_size: int) -> tf.data.Dataset:
    """Enumerated fixed-size batches, each cropped (``image_size // 8`` zero padding) and
    flipped per image with the seed of its batch index (`pad_crop_flip`)."""
    aug_seed = stream_seed(seed, SALT_ELEMENT)

    @tf.autograph.experimental.do_not_convert
    def augment_batch(i, batch):
        x, y = batch
        s = tf.random.experimental.stateless_fold_in(aug_seed, i)
        return i, (pad_crop_flip(x, s, image_size // 8), y)

    return ds.map(augment_batch, num_parallel_calls=AUTOTUNE)


def _image_label(*element):
    """A dataset element -> (image, label): (image, label) tuples, dicts or bare images."""
    if len(element) == 1:
        element = element[0]
        if isinstance(element, dict):
            return element["image"], tf.cast(element.get("label", tf.constant(0)), tf.int64)
        return element, tf.constant(0, tf.int64)
    return element[0], tf.cast(element[1], tf.int64)
