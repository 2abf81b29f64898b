"""``--stage=probe`` and ``--stage=supervised`` of ``python -m aetv2_tf.train``.

* ``--probe=knn``: a KNN (`aetv2_tf.probes.knn`; ``--knn_*``, by default the AETv1 code's) on
  the frozen ``--feature`` of ``--pretrained``, whole training pool against the test set, no
  augmentation, no validation split.
* ``--probe=fc1|fc2|fc3|conv|linear|nonlinear``: a head (`aetv2_tf.models.heads`) trained on
  the frozen feature for ``--epochs`` (the optimizer flags; ``--lr_schedule`` ``step`` or
  ``constant``), the epoch best on ``--val_examples`` held-out training images kept, the test
  set evaluated once (`aetv2_tf.probes.classifier.train_probe`); each epoch checkpointed and a
  rerun going on from the newest (`probe_epochs.EpochCheckpoints`).
* ``--stage=supervised``: NIN blocks 1..``--feature`` and the ``--probe`` head trained from
  scratch, with the probes' schedule and selection.

One stage for every Keras backend; the backend's part is the input adapter (`Inputs`: tf.data
under TensorFlow and for tf.data sources, else `data.stream.LabelledBatches` with the
augmentation on the device, `data.preprocessing_layers.ClassifierInputs`). Output in
``--model_dir``: ``results.json`` (`aetv2_tf.probes.results`), ``epochs.csv``,
``best.weights.h5`` and ``checkpoints/`` (heads), TensorBoard scalars where TensorFlow is
importable; the summary is printed on one line by ``train.main``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import keras
import numpy as np

from aetv2_tf.data.constants import normalization_constants
from aetv2_tf.errors import UsageError
from aetv2_tf.models import BACKBONES, batch_norm_kind, build_head
from aetv2_tf.probes import frozen_encoder
from aetv2_tf.probes.classifier import (
    build_probe,
    probe_optimizer,
    step_lr_schedule,
    train_probe,
    write_test_top1,
)
from aetv2_tf.probes.knn import extract_features, knn_accuracy, make_feature_fn, pooled_features
from aetv2_tf.probes.results import write_results
from aetv2_tf.probes.splits import ProbeData, load_probe_data
from aetv2_tf.program.config import RunConfig
from aetv2_tf.program.probe_epochs import EpochCheckpoints
from aetv2_tf.program.run_control import UNCHANGED_WEIGHTS, NothingLearned, values_digest
from aetv2_tf.program.run_lock import refuse_training

PROBE_LR_SCHEDULES = ("step", "constant")


class Inputs(NamedTuple):
    """The backend's input adapter: ``batches(images, labels, training, first_epoch=0)`` -> what
    ``fit`` takes (training: from epoch ``first_epoch`` (0-based) on, as the epochs before
    left it: CIFAR-10's arrays exactly), and ``preprocess()`` -> the first layer of a trained
    model (a new one each call), or None when the batches come normalised."""

    batches: Callable[..., Any]
    preprocess: Callable[[], keras.layers.Layer | None]


def backend_inputs(config: RunConfig, data: ProbeData, mean, std, image_size: int) -> Inputs:
    """tf.data under TensorFlow and for tf.data sources (tensorflow-datasets, image folders) on
    every backend (TensorFlow is then importable: the flag-support table checked it); NumPy
    batches and on-device preprocessing for CIFAR-10's arrays elsewhere."""
    batch, seed, augment = config.train.batch_size, config.train.seed, config.data.augment
    several = keras.distribution.distribution() is not None  # devices split every batch evenly
    if keras.backend.backend() == "tensorflow" or not isinstance(data.train, np.ndarray):
        from aetv2_tf.data.pipelines import classification_dataset

        if several and keras.backend.backend() != "tensorflow":
            raise UsageError(f"--dataset={config.data.dataset} is read by tf.data, whose last "
                             f"batches are short, and {len(keras.distribution.list_devices())} "
                             "devices "
                             "split every batch evenly: run it on one device (e.g. "
                             "CUDA_VISIBLE_DEVICES=0) or with KERAS_BACKEND=tensorflow.")

        def tf_batches(images, labels, training: bool, first_epoch: int = 0):
            import tensorflow as tf

            endless = training and isinstance(images, np.ndarray)  # epochs by their index
            ds = classification_dataset(
                images, labels, batch, seed, training=training, augment=augment,
                image_size=image_size, mean=mean, std=std, repeat=endless,
                start_step=first_epoch * -(-len(images) // batch) if endless else 0)
            return ds.apply(tf.data.experimental.assert_cardinality(
                tf.data.INFINITE_CARDINALITY)) if endless else ds

        return Inputs(tf_batches, lambda: None)
    from aetv2_tf.data.preprocessing_layers import ClassifierInputs
    from aetv2_tf.data.stream import LabelledBatches

    def array_batches(images, labels, training: bool, first_epoch: int = 0):
        batches = LabelledBatches(images, labels, batch, seed, shuffle=training,
                                  full_batches=several)
        for _ in range(first_epoch):  # the order of epoch e: the e-th `on_epoch_begin`'s
            batches.on_epoch_begin()
        return batches

    return Inputs(array_batches, lambda: ClassifierInputs(seed, augment, mean, std,
                                                          name="inputs"))


def check_probe(config: RunConfig) -> None:
    """The probe/supervised stage's own checks (`load` runs them first), before anything is
    written: the feature, what a supervised run or a head needs, ``--pretrained``."""
    probe, train, backbone = config.probe, config.train, config.model.backbone.name
    frozen_encoder.resolve_feature(backbone, probe.feature)
    if config.stage == "supervised":
        if backbone != "nin":
            raise UsageError("--stage=supervised is the NIN baseline of CIFAR-10; use "
                             "--backbone=nin --dataset=cifar10.")
        if probe.probe == "knn":
            raise UsageError("--stage=supervised trains blocks and a head: pass --probe=conv "
                             "(the paper's row) or another head, not knn.")
        if probe.pretrained and probe.pretrained.lower() != "none":
            raise UsageError("--stage=supervised trains from scratch: drop --pretrained (or "
                             "use --stage=probe to evaluate a pretrained encoder).")
    else:
        restore_preset(probe.pretrained)
        check_pretrained_is_not_model_dir(probe.pretrained, config.outputs.model_dir)
        if probe.pretrained and os.path.isdir(probe.pretrained):
            refuse_training(probe.pretrained, f"--pretrained={probe.pretrained}")
        frozen_encoder.check_pretrained(probe.pretrained, backbone,
                                  trust_saved_model=probe.trust_saved_model)
    if config.stage == "supervised" or probe.probe != "knn":
        if not train.epochs or train.train_steps:
            raise UsageError("probe heads and --stage=supervised train whole epochs: pass "
                             "--epochs=N (and --train_steps=0).")
        if not config.data.val_examples:
            raise UsageError("probe heads select their epoch on held-out training images: pass "
                             "--val_examples >= 1 (the test set is never used for selection).")
        optimizer = config.recipe.optimizer
        if optimizer.lr_schedule not in PROBE_LR_SCHEDULES:
            raise UsageError(f"--lr_schedule={optimizer.lr_schedule} is not available to probe "
                             f"heads; use one of {', '.join(PROBE_LR_SCHEDULES)} (step: drops at "
                             "--lr_drop_epochs, by default x0.2 at 30%, 60%, 80% of the epochs).")
        if optimizer.weight_decay_mode != "l2":
            raise UsageError("probe heads use PyTorch-style (coupled) L2 weight decay; pass "
                             "--weight_decay_mode=l2.")


def restore_preset(pretrained: str | None) -> None:
    """A preset's ``--pretrained`` run directory, its weights restored from the git history if
    absent (`presets.resolve`); a name that is no preset and no path is refused."""
    from aetv2_tf.files import presets

    if not pretrained or pretrained.strip().lower() == "none":
        return
    try:
        presets.resolve(pretrained)
    except (FileNotFoundError, presets.UnknownPreset) as e:
        raise UsageError(f"--pretrained={pretrained}: {e}") from e


def check_pretrained_is_not_model_dir(pretrained: str | None, model_dir: str | None) -> None:
    """UsageError when ``--model_dir``, where the probe writes its own run, is the
    ``--pretrained`` run or holds it (records mixed with it, or set aside by ``--overwrite``)."""
    if not pretrained or not model_dir or pretrained.strip().lower() == "none":
        return
    source = os.path.realpath(os.path.expanduser(pretrained))
    target = os.path.realpath(os.path.expanduser(model_dir))
    if source == target or source.startswith(target + os.sep):
        raise UsageError(f"--model_dir={model_dir} is (or holds) the --pretrained={pretrained} "
                         "run that this probe reads; a probe writes its own run, so choose "
                         "another --model_dir (e.g. a new folder beside it). Nothing was "
                         "changed.")


def check_probe_labels(data: ProbeData, dataset: str) -> None:
    """UsageError, before anything is written, when the training labels of arrays (CIFAR-10)
    hold fewer than 2 classes (the top-1 would be the test set's share of that class; a folder
    data set of one class is refused when it is listed)."""
    if data.train_labels is None:
        return
    classes = np.unique(np.asarray(data.train_labels))
    if len(classes) < 2:
        raise UsageError(
            f"--dataset={dataset}: the {data.sizes['train']} training images hold "
            f"{len(classes)} class ({', '.join(map(str, classes))}); a probe needs at least 2 "
            "classes (with one, its top-1 is only the test set's share of that class); fix the "
            "labels in --data_dir, or raise --train_examples. Nothing was written.")


class Loaded(NamedTuple):
    """What `load` reads before the model_dir is touched: the stage's data, its input adapter,
    the frozen encoder (None for --stage=supervised), the feature and normalisation."""

    data: ProbeData
    inputs: Inputs
    encoder: frozen_encoder.Encoder | None
    feature: str
    normalization: tuple


def load(config: RunConfig) -> Loaded:
    """Reads and checks everything the stage needs (data, sizes against --batch_size and
    --knn_k, the --pretrained encoder) BEFORE the adapter prepares --model_dir: a failure
    leaves nothing behind, so the corrected command is not refused as another run."""
    check_probe(config)
    probe, data_config, backbone = config.probe, config.data, config.model.backbone
    feature = frozen_encoder.resolve_feature(backbone.name, probe.feature)
    knn = config.stage == "probe" and probe.probe == "knn"
    batch = config.train.batch_size
    data = load_probe_data(data_config.dataset, data_config.data_dir,
                           val_examples=0 if knn else data_config.val_examples,
                           train_examples=data_config.train_examples,
                           test_examples=data_config.test_examples, seed=config.train.seed,
                           download=data_config.download)
    check_probe_labels(data, data_config.dataset)
    if knn and probe.knn_k > data.sizes["train"]:
        raise UsageError(f"--knn_k={probe.knn_k} exceeds the {data.sizes['train']} training "
                         "images; lower --knn_k or raise --train_examples.")
    if not knn and data.sizes["train"] < batch:
        raise UsageError(f"--batch_size={batch} is larger than the {data.sizes['train']} "
                         "training images (after --val_examples are held out); lower "
                         f"--batch_size to at most {data.sizes['train']} or use more images.")
    mean, std = normalization_constants(data_config.dataset)
    inputs = backend_inputs(config, data, mean, std, backbone.input_size)
    encoder = None
    if config.stage != "supervised":
        encoder = frozen_encoder.load_frozen_encoder(probe.pretrained, backbone.name, feature,
                                        batch_norm=batch_norm_kind(config.model.batch_norm),
                                        mean=mean, std=std,
                                        trust_saved_model=probe.trust_saved_model)
    return Loaded(data, inputs, encoder, feature, (mean, std))


def run(config: RunConfig, strategy: Any = None, chief: bool = True,
        loaded: Loaded | None = None) -> dict[str, Any]:
    """Runs the stage, writes results.json, returns the summary. ``strategy``: the TensorFlow
    adapter's tf.distribute strategy (None elsewhere); ``chief``: this worker writes the
    outputs; ``loaded``: what `load` read before the model_dir was prepared (None: read here)."""
    start = time.perf_counter()
    data, inputs, encoder, feature, (mean, std) = loaded or load(config)
    probe = config.probe
    knn = config.stage == "probe" and probe.probe == "knn"
    input_shape = config.model.backbone.input_shape
    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()

    if config.stage == "supervised":
        source = dict(pretrained=None, pretrained_kind=None, method="supervised")
        with scope:
            model = supervised_model(config, feature, data.num_classes, inputs.preprocess())
            outcome = fit_head(config, model, data, inputs.batches, chief)
    else:
        assert encoder is not None
        source = dict(pretrained=encoder.source, pretrained_kind=encoder.kind,
                      pretrained_checkpoint=encoder.checkpoint, method=encoder.method)
        if knn:
            outcome = knn_probe(config, encoder, data, inputs.batches, (mean, std), chief)
        else:
            with scope:
                model = build_probe(encoder.model, feature, probe.probe, data.num_classes,
                                    input_shape, inputs.preprocess(),
                                    **head_options(config, feature))
                outcome = fit_head(config, model, data, inputs.batches, chief)

    results = dict(
        probe=probe.probe, feature=feature, **source, dataset=config.data.dataset_name,
        num_classes=data.num_classes, train_examples=data.sizes["train"],
        val_examples=data.sizes["val"], test_examples=data.sizes["test"], **outcome,
        backend=keras.backend.backend(), wall_time_s=round(time.perf_counter() - start, 1),
        flags=config.flag_record())
    results["method"] = probe.method or results["method"]
    results["test_error"] = 100.0 - results["test_top1"]
    summary = {key: results[key] for key in ("probe", "feature", "method", "test_top1",
                                             "test_error", "val_top1", "selected_epoch",
                                             "wall_time_s") if results[key] is not None}
    if chief:
        summary["results"] = write_results(config.outputs.model_dir, results)
    return summary


def knn_probe(config: RunConfig, encoder: frozen_encoder.Encoder, data: ProbeData,
              batches: Callable, normalization: tuple, chief: bool) -> dict:
    """KNN on the pooled feature (``--knn_pool``, ``--knn_metric``, ``--knn_ties``; by default
    the published AETv1 code's protocol, `probes.knn`): whole training pool vs the test set.
    Arrays and a Keras encoder go through ``predict``; streams (tf.data) and SavedModels through
    the feature function over the evaluation ``batches``."""
    probe = config.probe

    def features(images, labels) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(images, np.ndarray) and isinstance(encoder.model, keras.Model):
            return pooled_features(encoder.model, encoder.feature, images,
                                   *normalization, pool=probe.knn_pool), labels
        return extract_features(make_feature_fn(encoder.model, encoder.feature),
                                batches(images, labels, False), pool=probe.knn_pool)

    t0 = time.perf_counter()
    train_x, train_y = features(data.train, data.train_labels)
    test_x, test_y = features(data.test, data.test_labels)
    t1 = time.perf_counter()
    top1 = knn_accuracy(train_x, train_y, test_x, test_y, k=probe.knn_k,
                        metric=probe.knn_metric, num_classes=data.num_classes,
                        ties=probe.knn_ties)
    t2 = time.perf_counter()
    if chief:
        write_test_top1(config.outputs.model_dir, top1, step=0)
    return dict(selected_epoch=None, val_top1=None, test_top1=top1,
                knn=dict(k=probe.knn_k, metric=probe.knn_metric, pool=probe.knn_pool,
                         ties=probe.knn_ties, feature_dim=int(train_x.shape[1])),
                timing_s=dict(features=round(t1 - t0, 1), knn=round(t2 - t1, 1)))


def head_options(config: RunConfig, feature: str) -> dict[str, Any]:
    """`build_head` options of the run; a nonlinear head on conv4 re-learns a conv5 layer."""
    return dict(batch_norm=batch_norm_kind(config.model.batch_norm),
                pool=config.probe.probe_pool,
                extra_convs=int(config.probe.probe == "nonlinear" and feature == "conv4"))


def supervised_model(config: RunConfig, feature: str, num_classes: int,
                     preprocess: keras.layers.Layer | None = None) -> keras.Model:
    """[preprocess] + NIN blocks 1..``feature`` + the ``--probe`` head, everything trainable:
    images -> logits (uint8 images when ``preprocess`` normalises them on the device)."""
    nin = BACKBONES["nin"]
    blocks = nin.builder(nin.input_shape, num_blocks=int(feature[len("block"):]),
                         batch_norm=batch_norm_kind(config.model.batch_norm))
    images = keras.Input(nin.input_shape, dtype="float32" if preprocess is None else "uint8",
                         name="image")
    features = blocks(images if preprocess is None else preprocess(images))[feature]
    head = build_head(config.probe.probe, tuple(features.shape[1:]), num_classes,
                      **head_options(config, feature))
    return keras.Model(images, head(features), name="supervised_nin")


def probe_schedule(config: RunConfig) -> Callable[[int], float] | None:
    """The heads' per-epoch rate: ``--lr_schedule=step`` drops by ``--lr_drop_factor`` at
    ``--lr_drop_epochs`` (default: 30%, 60%, 80% of --epochs); other schedules: constant."""
    optimizer = config.recipe.optimizer
    if optimizer.lr_schedule != "step":
        return None
    return step_lr_schedule(config.train.epochs, base_lr=optimizer.learning_rate,
                            factor=optimizer.lr_drop_factor, drop_epochs=optimizer.lr_drop_epochs)


def fit_head(config: RunConfig, model: keras.Model, data: ProbeData, batches: Callable,
             chief: bool) -> dict:
    """`train_probe` with the run's settings, its epochs kept and resumed (`EpochCheckpoints`);
    returns the selection and test numbers."""
    spec, model_dir = config.recipe.optimizer, config.outputs.model_dir
    optimizer = probe_optimizer(spec.name, spec.learning_rate, momentum=spec.momentum,
                                weight_decay=spec.weight_decay)
    epochs = EpochCheckpoints(os.path.join(model_dir, "checkpoints"), config.train.epochs, chief)
    try:
        history = epochs.resume(model, optimizer)
        start = values_digest(model)
        train = batches(data.train, data.train_labels, True, len(history))
        endless = int(getattr(train, "cardinality", lambda: 0)()) == -1  # tf.data's INFINITE
        outcome = train_probe(
            model, train, batches(data.val, data.val_labels, False),
            batches(data.test, data.test_labels, False), epochs=config.train.epochs,
            optimizer=optimizer, lr_schedule=probe_schedule(config),
            model_dir=model_dir if chief else None, log_dir=model_dir if chief else None,
            callbacks=[epochs], verbose=config.outputs.verbose, history=history,
            steps_per_epoch=-(-len(data.train) // config.train.batch_size) if endless else None)
    finally:
        epochs.signals.restore()
    if len(history) < config.train.epochs and values_digest(model) == start:
        raise NothingLearned(f"the classifier's {outcome['epochs_run'] - len(history)} epoch(s) "
                             f"{UNCHANGED_WEIGHTS}; no results were written.")
    return {**{key: outcome[key] for key in ("selected_epoch", "val_top1", "test_top1",
                                              "epochs_run")},
            "val_top1_history": [round(float(v), 2) for v in outcome["val_top1_history"]]}


def interrupted_where(config: RunConfig) -> str:
    """Where a signal outside a head's epochs (`EpochCheckpoints`) stops the stage, and how to
    go on (`signal_stop.interrupting`)."""
    if config.stage == "probe" and config.probe.probe == "knn":
        return ("during the knn probe: nothing of it was kept; rerun the same command to start "
                "it again")
    return (f"during the {config.probe.probe} {config.stage}, outside its epochs: the checkpoint "
            "of its last finished epoch, if any, is kept; rerun the same command to go on")
