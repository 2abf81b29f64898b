"""The probe stages' data: training, validation and test splits of every source.

The validation images are held out of the TRAINING set (model selection never sees the test
set, the dataset's labelled evaluation split):

* ``cifar10``: the pool is the first ``--train_examples`` of ``train``, the validation images a
  seeded random subset of it (`split_train_val`), the test set ``test``;
* ``imagenet2012``, ``places365_small`` (tensorflow-datasets slices): the first N of ``train``,
  its first ``--val_examples`` (tfds stores them shuffled), the test set ``validation``;
* ``folder``: ``ROOT/train/<class>/*`` in a seeded order, a seeded validation subset, the test set
  ``ROOT/val/<class>/*``.

``--test_examples`` keeps the first N test images (seeded shuffle for folders). A KNN passes
``val_examples=0``. Splits are made on indices, paths or slices before any image is decoded.
CIFAR-10 is numpy ``(N, 32, 32, 3)`` uint8 + labels (every backend); the other sources are
``tf.data.Dataset`` s of ``(image uint8 (h, w, 3), label int64)``.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np

from aetv2_tf.data.constants import CIFAR10_CLASSES
from aetv2_tf.data.image_folders import decode_image_file
from aetv2_tf.data.sources import DataError, list_image_folder, load_source
from aetv2_tf.errors import UsageError
from aetv2_tf.probes.classifier import split_train_val

TEST_SPLITS = {"cifar10": "test", "imagenet2012": "validation", "places365_small": "validation",
               "folder": "val"}


class ProbeData(NamedTuple):
    """Three splits; each is numpy images + labels, or a dataset of (image, label) + None."""

    train: Any
    train_labels: np.ndarray | None
    val: Any  # None without a validation split
    val_labels: np.ndarray | None
    test: Any
    test_labels: np.ndarray | None
    sizes: dict[str, int]  # {"train": ..., "val": ..., "test": ...}
    num_classes: int


def _check_val(val_examples: int, pool: int, dataset: str) -> None:
    if val_examples >= pool:
        raise UsageError(f"--val_examples={val_examples} leaves no training image of the "
                         f"{pool} in the {dataset} training pool; lower --val_examples (or raise "
                         "--train_examples).")


def load_probe_data(dataset: str, data_dir: str | None, *, val_examples: int,
                    train_examples: int = 0, test_examples: int = 0, seed: int = 0,
                    download: bool = False) -> ProbeData:
    """The train / validation / test splits of ``dataset`` (module docstring); DataError when
    the data is missing (with how to prepare it), UsageError when ``val_examples`` leaves no
    training image."""
    data_dir = None if data_dir is None else os.path.expanduser(data_dir)
    if dataset == "folder":
        return _folder(data_dir, val_examples, train_examples, test_examples, seed)
    if dataset in ("imagenet2012", "places365_small"):
        return _tfds(dataset, data_dir, val_examples, train_examples, test_examples, download)
    images, labels = load_source(dataset, data_dir, "train", download=download,
                                 limit=train_examples or None)
    test, test_labels = load_source(dataset, data_dir, TEST_SPLITS[dataset], download=download,
                                    limit=test_examples or None)
    if train_examples:
        images, labels = images[:train_examples], labels[:train_examples]
    if test_examples:
        test, test_labels = test[:test_examples], test_labels[:test_examples]
    val = val_labels = None
    if val_examples:
        _check_val(val_examples, len(images), dataset)
        split = split_train_val(images, labels, val_examples, seed)
        images, labels, val, val_labels = split[:4]
    sizes = dict(train=len(images), val=val_examples, test=len(test))
    return ProbeData(images, labels, val, val_labels, test, test_labels, sizes, CIFAR10_CLASSES)


def _tfds(name: str, data_dir: str | None, val_examples: int, train_examples: int,
          test_examples: int, download: bool) -> ProbeData:
    """tensorflow-datasets splits as slices (``train[V:N]``, ``train[:V]``, ``validation[:M]``)."""
    import tensorflow_datasets as tfds

    test_split = TEST_SPLITS[name]
    load_source(name, data_dir, test_split, download=download)  # DataError when not prepared
    info = tfds.builder(name, data_dir=data_dir, try_gcs=False).info
    total = info.splits["train"].num_examples
    pool = min(train_examples or total, total)
    n_test = min(test_examples or info.splits[test_split].num_examples,
                 info.splits[test_split].num_examples)
    _check_val(val_examples, pool, name)

    def source(split: str) -> Any:
        return load_source(name, data_dir, split, download=download)

    return ProbeData(
        source(f"train[{val_examples}:{pool}]"), None,
        source(f"train[:{val_examples}]") if val_examples else None, None,
        source(f"{test_split}[:{n_test}]"), None,
        dict(train=pool - val_examples, val=val_examples, test=n_test),
        int(info.features["label"].num_classes))


def _folder(root: str | None, val_examples: int, train_examples: int, test_examples: int,
            seed: int) -> ProbeData:
    """``root/train/<class>/*`` and ``root/val/<class>/*``, split on the path lists."""
    if root is None:
        raise DataError("--dataset=folder needs --data_dir=ROOT holding ROOT/train/<class>/ and "
                        "ROOT/val/<class>/.")
    paths, labels, classes, _ = list_image_folder(root, "train")
    test_paths, test_labels, test_classes, _ = list_image_folder(root, TEST_SPLITS["folder"])
    if test_classes != classes:
        raise DataError(f"{root}/train and {root}/val have different class folders "
                        f"({len(classes)} vs {len(test_classes)}); both need the same classes.")
    rng = np.random.default_rng(seed)
    order, test_order = rng.permutation(len(paths)), rng.permutation(len(test_paths))
    paths, labels = np.asarray(paths)[order], labels[order]
    test_paths, test_labels = np.asarray(test_paths)[test_order], test_labels[test_order]
    if train_examples:
        paths, labels = paths[:train_examples], labels[:train_examples]
    if test_examples:
        test_paths, test_labels = test_paths[:test_examples], test_labels[:test_examples]
    val = None
    if val_examples:
        _check_val(val_examples, len(paths), "folder")
        paths, labels, val_paths, val_labels = split_train_val(paths, labels, val_examples,
                                                               seed)[:4]
        val = decode_folder(val_paths, val_labels)
    return ProbeData(decode_folder(paths, labels, shuffle_seed=seed), None, val, None,
                     decode_folder(test_paths, test_labels), None,
                     dict(train=len(paths), val=val_examples, test=len(test_paths)),
                     len(classes))


def decode_folder(paths: np.ndarray, labels: np.ndarray,
                  shuffle_seed: int | None = None) -> Any:
    """Files -> a dataset of (image uint8 (h, w, 3), label int64), decoded lazily; with
    ``shuffle_seed`` the whole (class-sorted) path list reshuffled every epoch before decoding,
    which the pipeline's bounded shuffle buffer of crops could not do."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((paths, labels.astype(np.int64)))
    if shuffle_seed is not None:
        ds = ds.shuffle(len(paths), seed=shuffle_seed, reshuffle_each_iteration=True)
    return ds.map(tf.autograph.experimental.do_not_convert(decode_image_file),
                  num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
