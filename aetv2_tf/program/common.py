"""What both adapters' stages share beyond the configuration (`program.config`) and the step
arithmetic (`program.run_length`): the training images, the fit and its summary, the start line
and the quick KNN. Nothing here imports TensorFlow; neither adapter is imported.
"""

from __future__ import annotations

import time

import keras
from absl import logging

from aetv2_tf.program.config import RunConfig
from aetv2_tf.program.precision import Choice


def load_train_images(config: RunConfig, split: str = "train"):
    """The pretext stage's images: numpy (N, H, W, 3) uint8 + labels for CIFAR-10 from its
    python files, the checked file list of a folder (`ImageFiles`, one class folder or more:
    pretraining reads no label; ``--train_examples`` takes a seeded random subset), else a
    tf.data source (TensorFlow): ``(images, labels or None, size or None)``."""
    from aetv2_tf.data.image_folders import ImageFiles
    from aetv2_tf.data.sources import load_source

    data, seed = config.data, config.train.seed
    examples = data.train_examples if split == "train" else 0
    source = load_source(data.dataset, data.data_dir, split, download=data.download,
                         shuffle_seed=seed, min_classes=1, limit=examples or None)
    if isinstance(source, ImageFiles):
        if examples:
            source = source.subset(examples, seed)
        return source, None, len(source.paths)
    if isinstance(source, tuple):
        images, labels = source
        if examples:
            images, labels = images[:examples], labels[:examples]
        return images, labels, len(images)
    if examples:
        source = source.take(examples)
    size = int(source.cardinality())  # known for tensorflow-datasets splits and folders
    return source, None, size if size >= 0 else None


def rotation_objective() -> tuple[keras.losses.Loss, list[keras.metrics.Metric]]:
    """RotNet's loss and metric: the cross-entropy over the 4 quarter turns, its accuracy."""
    return (keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            [keras.metrics.SparseCategoricalAccuracy(name="rotation_accuracy")])


def fit_and_summarize(config: RunConfig, model: keras.Model, data, start: int, stop: int,
                      steps: int, per_epoch: int, callbacks: list,
                      **fit_kwargs) -> tuple[dict, bool]:
    """``model.fit`` of steps ``start .. stop - 1`` on ``data`` (which ends after step
    ``stop - 1``), with the program's `monitoring.ProgressBar` where ``--verbose``, then the run's
    summary (``steps`` reached of ``run_steps``, the last logs in the order shown, ...) and
    whether it FINISHED (reached all ``steps`` cleanly: the stage then writes the encoder,
    exports, runs the quick KNN). ``callbacks`` holds the run's `StepCounter`, `StopOnSignal`,
    `StopOnSkippedStep` and checkpoint saver (with ``refused``)."""
    from aetv2_tf.files.digests import weights_digest
    from aetv2_tf.method.metrics import shown_order
    from aetv2_tf.program.callbacks import (
        StepCounter,
        StopAtDeadline,
        StopOnSignal,
        StopOnSkippedStep,
    )
    from aetv2_tf.program.loss_growth import StopOnLossGrowth
    from aetv2_tf.program.monitoring import ProgressBar
    from aetv2_tf.program.run_length import fit_epochs

    train = config.train
    counter, signals, skips = (next(c for c in callbacks if isinstance(c, kind))
                               for kind in (StepCounter, StopOnSignal, StopOnSkippedStep))
    saver = next(c for c in callbacks if hasattr(c, "refused"))
    growth = next((c for c in callbacks if isinstance(c, StopOnLossGrowth)), None)
    t0 = time.perf_counter()
    history = {}
    if start < stop:
        if config.outputs.verbose:  # Keras's bar, the loss first and stopping where it stops
            callbacks = [*callbacks, ProgressBar(lambda: counter() >= steps)]
        fit = model.fit(data, callbacks=callbacks, verbose=config.outputs.verbose, **fit_kwargs,
                        **fit_epochs(start, stop, per_epoch, train.steps_per_execution))
        history = {k: float(fit.history[k][-1]) for k in shown_order(fit.history)}
    wall = time.perf_counter() - t0
    done = counter()
    summary = dict(steps=done, run_steps=steps, start_step=start, wall_time_s=round(wall, 1),
                   pairs_per_sec=round((done - start) * train.batch_size / max(wall, 1e-9), 1),
                   **history, trainable_digest=weights_digest(model.trainable_weights))
    skipped = getattr(model.optimizer, "skipped_steps", None)
    if skipped is not None and int(keras.ops.convert_to_numpy(skipped.value)):
        summary["skipped_steps"] = int(keras.ops.convert_to_numpy(skipped.value))
    if any(isinstance(c, StopAtDeadline) and c.reached for c in callbacks):
        summary["stopped_at_deadline"] = True  # --stop_after_seconds: not an error, not the end
    outcomes = dict(interrupted_by=signals.received, diverged=skips.diverged,
                    stopped_nonfinite=skips.stopped, nonfinite_weights=saver.refused,
                    loss_grew=growth.grew if growth else None)
    summary.update({key: value for key, value in outcomes.items() if value})
    return summary, done >= steps and not any(outcomes.values())


def start_line(config: RunConfig, distribution: str, replicas: int, precision: Choice, data,
               kernels: str = "") -> str:
    """One line: what runs, on which data, distribution, precision (and why) and, where given,
    the CPU kernels (``kernels``, e.g. "oneDNN on")."""
    if config.stage == "pretext":
        what = "RotNet" if config.pretext == "rotation" else \
            {"geodesic": "AETv2 (geodesic loss)",
             "mse": "AETv1 (parameter MSE)"}[config.recipe.loss.kind]
    elif config.stage == "probe":
        what = f"{config.probe.probe} probe of {config.probe.pretrained}"
    else:
        what = "supervised NIN"
    images = f", {data[2]} training images" if data and data[2] else ""
    return (f"aetv2_tf {config.stage}: {what} | {config.data.dataset}{images} | "
            f"{distribution} x{replicas} | "
            f"{precision.policy} ({precision.reason}) | {kernels + ' | ' if kernels else ''}"
            f"{config.outputs.model_dir}")


def quick_knn_summary(config: RunConfig, encoder: keras.Model, images, labels) -> dict:
    """``--quick_knn_train/test``: KNN of the trained and of a random-init encoder (seeded by
    ``--seed``, as ``--pretrained=none``) on the first training and test images; printed and
    returned (`probes.quick_knn`)."""
    from aetv2_tf.data.constants import normalization_constants
    from aetv2_tf.data.sources import load_source
    from aetv2_tf.models.backbones import build_backbone
    from aetv2_tf.probes.quick_knn import quick_knn

    if labels is None:
        logging.warning("--quick_knn_train: only for CIFAR-10 from its python files; skipped.")
        return {}
    data, backbone = config.data, config.model.backbone
    test_images, test_labels = load_source(data.dataset, data.data_dir, "test")
    keras.utils.set_random_seed(config.train.seed)  # the random init of --pretrained=none
    random_encoder = build_backbone(backbone.name, tuple(images.shape[1:]),
                                    config.model.batch_norm)
    n, m = config.outputs.quick_knn_train, config.outputs.quick_knn_test
    train_set, test_set = (images[:n], labels[:n]), (test_images[:m], test_labels[:m])
    feature = backbone.probe_feature
    result = quick_knn(encoder, random_encoder, train_set, test_set, feature,
                       *normalization_constants(data.dataset))
    print(f"Quick KNN (the authors': k=10, Euclidean, {feature} pooled 2x2; first "
          f"{len(train_set[0])} training images vs first {len(test_set[0])} test images): "
          f"{result['knn_top1']:.2f}% trained vs {result['random_knn_top1']:.2f}% random init "
          f"({result['knn_gain']:+.2f} points, {result['knn_seconds']:.0f} s).", flush=True)
    return result
