"""The pretraining's data, as every backend receives it (`backend.Backend`'s methods): the
training images read once (`read`) and what the run derives from its configuration alike on
every backend (`PretextData`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from aetv2_tf.data.constants import normalization_constants
from aetv2_tf.program.config import RunConfig


@dataclasses.dataclass(frozen=True)
class PretextData:
    """The pretraining's images: ``images`` (numpy (N, H, W, 3) uint8, a folder's
    `ImageFiles`, or a tf.data source), their ``labels`` (CIFAR-10's, for the quick KNN; else
    None) and ``num_examples`` (None: unknown); with what the run derives from its
    configuration alike on every backend: ``side`` (the backbone's input side), ``rotation``
    (RotNet), ``images_per_step`` (RotNet: a quarter of the batch, shown in 4 rotations), and
    ``mean``, ``std``: the dataset's normalisation (`normalization_constants`, the one rule that
    the probes and the export follow too)."""

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
    """The training images: CIFAR-10 from its python files; a folder's checked file list
    (`ImageFiles`, of one class folder or more: pretraining reads no label;
    ``--train_examples`` takes a seeded random subset); else a tf.data source."""
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
