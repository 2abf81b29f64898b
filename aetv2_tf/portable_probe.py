"""KNN evaluation on a Keras backend other than TensorFlow: `--stage=probe --probe=knn`, with
`probes.knn`.

The probe: the frozen `--feature` (NIN block 2 by default) of `--pretrained` (a run of either
program, via `probes.encoders.load_encoder`, or `none`: a random init seeded by `--seed`) on the
first `--train_examples` CIFAR-10 training images (all by default) and `--test_examples` test
images, average-pooled on the device, classified by `--knn_k` neighbours (`--knn_metric`);
`results.json` as the TensorFlow probe writes it (`probes.results`, `probes.stage.run`), with
`selected_epoch`/`val_top1` null (nothing is selected). No TensorBoard file.
"""

from __future__ import annotations

import os
import time

import keras

from aetv2_tf.data.constants import CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD
from aetv2_tf.flags import FLAGS, run_flags
from aetv2_tf.probes.knn import knn_accuracy, pooled_features
from aetv2_tf.rundir import UsageError


def knn_stage() -> dict:
    """Runs the KNN probe of the flags; writes results.json; returns the summary."""
    from aetv2_tf.data.sources import load_source
    from aetv2_tf.probes import encoders
    from aetv2_tf.probes.results import write_results

    F = FLAGS
    start = time.perf_counter()
    feature = encoders.resolve_feature(F.backbone, F.feature)
    data_dir = os.path.expanduser(F.data_dir) if F.data_dir else None
    images, labels = load_source(F.dataset, data_dir, "train")
    test, test_labels = load_source(F.dataset, data_dir, "test")
    if F.train_examples:
        images, labels = images[:F.train_examples], labels[:F.train_examples]
    if F.test_examples:
        test, test_labels = test[:F.test_examples], test_labels[:F.test_examples]
    if F.knn_k > len(images):
        raise UsageError(f"--knn_k={F.knn_k} exceeds the {len(images)} training images; "
                         "lower --knn_k or raise --train_examples.")
    encoder = encoders.load_encoder(F.pretrained, F.backbone, feature, batch_norm="keras",
                                    mean=CIFAR10_MEAN, std=CIFAR10_STD)
    t0 = time.perf_counter()
    train_x = pooled_features(encoder.model, feature, images, CIFAR10_MEAN, CIFAR10_STD)
    test_x = pooled_features(encoder.model, feature, test, CIFAR10_MEAN, CIFAR10_STD)
    t1 = time.perf_counter()
    top1 = knn_accuracy(train_x, labels, test_x, test_labels, k=F.knn_k, metric=F.knn_metric,
                        num_classes=CIFAR10_CLASSES)
    t2 = time.perf_counter()
    results = dict(
        probe=F.probe, feature=feature, pretrained=encoder.source, pretrained_kind=encoder.kind,
        pretrained_checkpoint=encoder.checkpoint, method=F.method or encoder.method,
        dataset=F.dataset_name or F.dataset, num_classes=CIFAR10_CLASSES,
        train_examples=len(images), val_examples=0, test_examples=len(test),
        selected_epoch=None, val_top1=None, test_top1=top1, test_error=100.0 - top1,
        knn=dict(k=F.knn_k, metric=F.knn_metric, feature_dim=int(train_x.shape[1])),
        timing_s=dict(features=round(t1 - t0, 1), knn=round(t2 - t1, 1)),
        backend=keras.backend.backend(), wall_time_s=round(time.perf_counter() - start, 1),
        flags=run_flags())
    summary = {key: results[key] for key in ("probe", "feature", "method", "test_top1",
                                             "test_error", "wall_time_s")
               if results[key] is not None}
    summary["results"] = write_results(F.model_dir, results)
    return summary
