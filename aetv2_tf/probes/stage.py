"""``--stage=probe`` and ``--stage=supervised`` of ``python -m aetv2_tf.train``.

* ``--stage=probe --probe=knn``: a k-nearest-neighbour classifier (``--knn_k``, ``--knn_metric``)
  on the average-pooled frozen ``--feature`` of ``--pretrained``: features of the whole training
  pool and of the test set are extracted once (no augmentation), then every test image is
  classified (`aetv2_tf.probes.knn`). There is nothing to select, so no validation split.
* ``--stage=probe --probe=fc1|fc2|fc3|conv|linear|nonlinear``: a head (`aetv2_tf.models.heads`)
  trained on the frozen feature for ``--epochs`` with ``--optimizer`` (SGD Nesterov in the
  configs), ``--learning_rate``, ``--momentum``, ``--weight_decay`` (PyTorch-style coupled L2) and
  ``--lr_schedule`` (``step``: x0.2 at 30/60/80% of the epochs, or ``constant``). The epoch with
  the best accuracy on ``--val_examples`` images held out of the training set is kept; the test
  set is evaluated once, at the end (`aetv2_tf.probes.classifier.train_probe`).
* ``--stage=supervised``: the fully supervised lower bound: NIN blocks 1..2 (up to ``--feature``)
  and the ``--probe`` head (conv: a third NIN block, GAP, Dense), all trained from scratch with the
  labels, with the schedule and selection of the probes.

Output, in ``--model_dir``: ``results.json`` (`aetv2_tf.probes.results`; the method label comes
from ``--method``, else from the pretrained run's flags), TensorBoard scalars (``train/``,
``validation/``, ``test/``), ``best.weights.h5`` of the selected epoch (heads); the returned
summary is printed on one line by ``train.main``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from aetv2_tf.data.pipelines import classification_dataset, normalization_constants
from aetv2_tf.flags import FLAGS, run_flags
from aetv2_tf.models import DEFAULT_INPUT_SHAPES, build_head, build_nin
from aetv2_tf.probes import encoders
from aetv2_tf.probes.classifier import build_probe, probe_optimizer, train_probe, write_scalar
from aetv2_tf.probes.data import ProbeData, load_probe_data
from aetv2_tf.probes.knn import extract_features, knn_accuracy, make_feature_fn
from aetv2_tf.probes.results import write_results
from aetv2_tf.rundir import UsageError

PROBE_LR_SCHEDULES = ("step", "constant")
# (images, labels, training) -> batches (x (B, S, S, 3) normalised float32, labels (B,) int64)
Batches = Callable[[Any, Any, bool], tf.data.Dataset]


def check_flags() -> None:
    """The probe/supervised flag checks, run by ``train.check_flags`` before anything is written."""
    F = FLAGS
    encoders.resolve_feature(F.backbone, F.feature)
    if F.stage == "supervised":
        if F.backbone != "nin":
            raise UsageError("--stage=supervised is the NIN baseline of CIFAR-10; use "
                             "--backbone=nin --dataset=cifar10.")
        if F.probe == "knn":
            raise UsageError("--stage=supervised trains blocks and a head: pass --probe=conv "
                             "(the paper's row) or another head, not knn.")
        if F.pretrained and F.pretrained.lower() != "none":
            raise UsageError("--stage=supervised trains from scratch: drop --pretrained (or "
                             "use --stage=probe to evaluate a pretrained encoder).")
    else:
        encoders.check_pretrained(F.pretrained, F.backbone)
    if F.stage == "supervised" or F.probe != "knn":
        if not F.epochs or F.train_steps:
            raise UsageError("probe heads and --stage=supervised train whole epochs: pass "
                             "--epochs=N (and --train_steps=0).")
        if not F.val_examples:
            raise UsageError("probe heads select their epoch on held-out training images: pass "
                             "--val_examples >= 1 (the test set is never used for selection).")
        if F.lr_schedule not in PROBE_LR_SCHEDULES:
            raise UsageError(f"--lr_schedule={F.lr_schedule} is not available to probe heads; "
                             f"use one of {', '.join(PROBE_LR_SCHEDULES)} (step: x0.2 at 30%, "
                             "60%, 80% of the epochs).")
        if F.weight_decay_mode != "l2":
            raise UsageError("probe heads use PyTorch-style (coupled) L2 weight decay; pass "
                             "--weight_decay_mode=l2.")


def run(strategy: tf.distribute.Strategy, chief: bool) -> dict[str, Any]:
    """Runs the probe or supervised stage; writes results.json; returns the summary."""
    F = FLAGS
    start = time.perf_counter()
    feature = encoders.resolve_feature(F.backbone, F.feature)
    knn = F.stage == "probe" and F.probe == "knn"
    data = load_probe_data(F.dataset, F.data_dir, val_examples=0 if knn else F.val_examples,
                           train_examples=F.train_examples, test_examples=F.test_examples,
                           seed=F.seed, download=F.download)
    mean, std = normalization_constants(F.dataset)
    input_shape = DEFAULT_INPUT_SHAPES[F.backbone]

    def batches(images, labels, training: bool) -> tf.data.Dataset:
        return classification_dataset(images, labels, F.batch_size, F.seed, training=training,
                                      augment=F.augment, image_size=input_shape[0], mean=mean,
                                      std=std)

    if F.stage == "supervised":
        source = dict(pretrained=None, pretrained_kind=None, method="supervised")
        with strategy.scope():
            model = supervised_model(feature, data.num_classes)
            outcome = fit_head(model, data, batches, chief)
    else:
        encoder = encoders.load_encoder(F.pretrained, F.backbone, feature,
                                        batch_norm=F.batch_norm, mean=mean, std=std)
        source = dict(pretrained=encoder.source, pretrained_kind=encoder.kind,
                      pretrained_checkpoint=encoder.checkpoint, method=encoder.method)
        if knn:
            outcome = knn_probe(encoder, data, batches, chief)
        else:
            with strategy.scope():
                model = build_probe(encoder.model, feature, F.probe, data.num_classes,
                                    input_shape, **head_options(feature))
                outcome = fit_head(model, data, batches, chief)

    results = dict(
        probe=F.probe, feature=feature, **source, dataset=F.dataset_name or F.dataset,
        num_classes=data.num_classes, train_examples=data.sizes["train"],
        val_examples=data.sizes["val"], test_examples=data.sizes["test"], **outcome,
        wall_time_s=round(time.perf_counter() - start, 1), flags=run_flags())
    results["method"] = F.method or results["method"]
    results["test_error"] = 100.0 - results["test_top1"]
    summary = {key: results[key] for key in ("probe", "feature", "method", "test_top1",
                                             "test_error", "val_top1", "selected_epoch",
                                             "wall_time_s") if results[key] is not None}
    if chief:
        summary["results"] = write_results(F.model_dir, results)
    return summary


def knn_probe(encoder: encoders.Encoder, data: ProbeData, batches: Batches, chief: bool) -> dict:
    """KNN on the average-pooled feature: whole training pool vs the test set."""
    F = FLAGS
    if F.knn_k > data.sizes["train"]:
        raise UsageError(f"--knn_k={F.knn_k} exceeds the {data.sizes['train']} training images; "
                         "lower --knn_k or raise --train_examples.")
    feature_fn = make_feature_fn(encoder.model, encoder.feature)
    t0 = time.perf_counter()
    train_x, train_y = extract_features(feature_fn, batches(data.train, data.train_labels, False))
    test_x, test_y = extract_features(feature_fn, batches(data.test, data.test_labels, False))
    t1 = time.perf_counter()
    top1 = knn_accuracy(train_x, train_y, test_x, test_y, k=F.knn_k, metric=F.knn_metric,
                        num_classes=data.num_classes)
    t2 = time.perf_counter()
    if chief:
        writer = tf.summary.create_file_writer(os.path.join(F.model_dir, "test"))
        with writer.as_default():
            write_scalar("top1", top1, step=0)
        writer.flush()
    return dict(selected_epoch=None, val_top1=None, test_top1=top1,
                knn=dict(k=F.knn_k, metric=F.knn_metric, feature_dim=int(train_x.shape[1])),
                timing_s=dict(features=round(t1 - t0, 1), knn=round(t2 - t1, 1)))


def head_options(feature: str) -> dict[str, Any]:
    """`build_head` options from the flags; a nonlinear head on conv4 re-learns a conv5 layer."""
    return dict(batch_norm=FLAGS.batch_norm, pool=FLAGS.probe_pool,
                extra_convs=int(FLAGS.probe == "nonlinear" and feature == "conv4"))


def supervised_model(feature: str, num_classes: int) -> keras.Model:
    """NIN blocks 1..``feature`` + the ``--probe`` head, everything trainable: images -> logits."""
    F = FLAGS
    input_shape = DEFAULT_INPUT_SHAPES["nin"]
    blocks = build_nin(input_shape, num_blocks=int(feature[len("block"):]),
                       batch_norm=F.batch_norm)
    images = keras.Input(input_shape, name="image")
    features = blocks(images)[feature]
    head = build_head(F.probe, tuple(features.shape[1:]), num_classes, **head_options(feature))
    return keras.Model(images, head(features), name="supervised_nin")


def fit_head(model: keras.Model, data: ProbeData, batches: Batches, chief: bool) -> dict:
    """`train_probe` with the stage's flags; returns the selection and test numbers."""
    F = FLAGS
    optimizer = probe_optimizer(F.optimizer, F.learning_rate, momentum=F.momentum,
                                weight_decay=F.weight_decay)
    outcome = train_probe(
        model, batches(data.train, data.train_labels, True),
        batches(data.val, data.val_labels, False), batches(data.test, data.test_labels, False),
        epochs=F.epochs, optimizer=optimizer,
        lr_schedule="step" if F.lr_schedule == "step" else None,
        model_dir=F.model_dir if chief else None, log_dir=F.model_dir if chief else None,
        verbose=F.verbose)
    history = [round(float(v), 2) for v in outcome["val_top1_history"]]
    return dict(selected_epoch=outcome["selected_epoch"], val_top1=outcome["val_top1"],
                test_top1=outcome["test_top1"], epochs_run=outcome["epochs_run"],
                val_top1_history=history)
