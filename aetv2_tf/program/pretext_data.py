"""The pretraining's data as every backend receives it: the training images (`read`) and what
the run derives from its configuration (`PretextData`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from aetv2_tf.data.constants import normalization_constants
from aetv2_tf.program.config import RunConfig


@dataclasses.dataclass(frozen=True)
class PretextData:
    """``images`` (numpy (N, H, W, 3) uint8, a folder's `ImageFiles`, or a tf.data source),
    ``labels`` (CIFAR-10's, for the quick KNN; else None), ``num_examples`` (None: unknown),
    ``side`` (the backbone's input side), ``rotation`` (RotNet), ``images_per_step`` (RotNet: a
    quarter of the batch) and ``mean``, ``std`` (`normalization_constants`)."""

    images: Any
    labels: Any
    num_examples: int | None
    side: int
    rotation: bool
    images_per_step: int
    mean: Any
    std: Any

    @classmethod
    def of(cls, config: RunConfig, images, labels=None,
           num_examples: int | None = None) -> PretextData:
        """The data of ``images`` for the run of ``config``."""
        rotation, batch = config.pretext == "rotation", config.train.batch_size
        return cls(images, labels, num_examples, config.image_size, rotation,
                   batch // 4 if rotation else batch,
                   *normalization_constants(config.data.dataset))


def read(config: RunConfig) -> PretextData:
    """The training images: CIFAR-10's arrays, a folder's checked file list (`ImageFiles`, no
    labels; ``--train_examples``: a seeded random subset), or a tf.data source."""
    from aetv2_tf.data.image_folders import ImageFiles
    from aetv2_tf.data.sources import load_source

    data, seed, examples = config.data, config.train.seed, config.data.train_examples
    source = load_source(data.dataset, data.data_dir, "train", download=data.download,
                         shuffle_seed=seed, min_classes=1, limit=examples or None)
    if isinstance(source, ImageFiles):
        source = source.subset(examples, seed) if examples else source
        return PretextData.of(config, source, None, len(source.paths))
    if isinstance(source, tuple):
        images, labels = (part[:examples] for part in source) if examples else source
        return PretextData.of(config, images, labels, len(images))
    source = source.take(examples) if examples else source
    size = int(source.cardinality())  # known for tensorflow-datasets splits and folders
    return PretextData.of(config, source, None, size if size >= 0 else None)
