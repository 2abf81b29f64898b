"""The training program: `python -m aetv2_tf.train --flagfile=configs/<experiment>.cfg`.

One absl entry point for every stage (see `aetv2_tf/flags.py` or `--helpfull`):

- `--stage=pretext`: self-supervised pretraining, AETv2 (`--loss=geodesic`), AETv1
  (`--loss=mse`) or RotNet (`--pretext=rotation`);
- `--stage=probe`: a frozen encoder evaluated by KNN or a trained classifier head;
- `--stage=supervised`: the fully supervised NIN baseline.

Everything a run produces lives under `--model_dir` (layout in `aetv2_tf/rundir.py`); rerunning
the same command resumes from the newest checkpoint, at the same step and learning rate.

The Keras backend decides which program runs: TensorFlow (the default) runs this module's
program (tf.distribute, tf.data, TensorBoard, SavedModel export); any other backend
(`KERAS_BACKEND=jax`) runs `aetv2_tf.portable` with the same flags, and TensorFlow is then never
imported (the module and `--helpfull` load without it).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import sys
import time

from aetv2_tf import console

with console.quiet_native_stderr(not console.verbose_requested()):
    import keras
    import numpy as np

    TENSORFLOW = keras.backend.backend() == "tensorflow"
    if TENSORFLOW:  # other backends run aetv2_tf.portable and never import TensorFlow
        import tensorflow as tf
from absl import app, logging

from aetv2_tf import optim, rundir
from aetv2_tf.data.sources import DataError
from aetv2_tf.flags import ESSENTIAL, FLAGS, flagfile_text, run_flags
from aetv2_tf.precision import Choice, choose_precision
from aetv2_tf.rundir import UsageError

IMAGE_SIZE = {"nin": 32, "alexnet": 224}


def check_flags(num_replicas: int) -> None:
    """Rejects contradictory flags before anything is written."""
    F = FLAGS
    check_common_flags(num_replicas)
    if F.stage != "pretext":
        from aetv2_tf.probes.stage import check_flags as check_probe_flags

        check_probe_flags()
    if F.mixed_precision == "mixed_float16" and not tf.config.list_logical_devices("GPU"):
        raise UsageError("--mixed_precision=mixed_float16 needs a GPU; on a CPU use "
                         "mixed_bfloat16 (fast with AMX) or none.")


def check_common_flags(num_replicas: int) -> None:
    """The flag checks of every backend (no TensorFlow): steps, batch split, data, backbone."""
    F = FLAGS
    if F.stage == "pretext" and not (F.epochs or F.train_steps):
        raise UsageError("pass --epochs or --train_steps (both are 0).")
    if F.batch_size % num_replicas:
        raise UsageError(f"--batch_size={F.batch_size} is not divisible by the {num_replicas} "
                         f"replicas of --strategy={F.strategy}; use a multiple of {num_replicas}.")
    if F.dataset == "cifar10" and F.backbone == "alexnet":
        raise UsageError("--backbone=alexnet expects 224x224 images, --dataset=cifar10 has 32x32; "
                         "use --backbone=nin for CIFAR-10.")
    if F.dataset != "cifar10" and F.backbone == "nin":
        raise UsageError(f"--backbone=nin is the CIFAR-10 network; use --backbone=alexnet for "
                         f"--dataset={F.dataset}.")
    if F.stage == "probe" and not F.pretrained:
        raise UsageError("--stage=probe needs --pretrained=<model_dir|SavedModel dir|none>.")
    if F.pretext == "rotation" and F.loss == "mse" and F.stage == "pretext":
        logging.info("--loss is ignored by --pretext=rotation (cross-entropy over 4 rotations).")


def geodesic_loss(param_std, image_size: int):
    """The `GeodesicLoss` of the flags (`--projection_weight`, `--angle_power`, ...)."""
    from aetv2_tf.losses import GeodesicLoss

    F = FLAGS
    if F.loss_frame == "pixel":
        frame = pixel_frame(image_size)
    else:  # the model frame, its coordinates multiplied by --loss_frame_scale
        frame = None if F.loss_frame_scale == 1.0 else \
            np.diag([F.loss_frame_scale, F.loss_frame_scale, 1.0]).tolist()
    return GeodesicLoss(F.projection_weight, angle_power=F.angle_power,
                        residual_scale=F.residual_scale, chordal_weight=F.chordal_weight,
                        mse_weight=F.mse_weight, mse_std=param_std,
                        mse_decay_steps=F.mse_decay_steps, frame=frame)


def aet_loss(param_std, image_size: int, optimizer) -> tuple[keras.losses.Loss, list]:
    """The AET loss of the flags (geodesic: AETv2, mse: AETv1) and the pretext metrics."""
    from aetv2_tf import losses, metrics

    if FLAGS.loss == "geodesic":
        loss = geodesic_loss(param_std, image_size)
        loss.step = optimizer.iterations  # read by an MSE warm-up (--mse_decay_steps)
    else:
        loss = losses.ParameterMSELoss(std=param_std if FLAGS.mse_normalize else None)
    return loss, metrics.pretext_metrics()


def schedule_and_optimizer(model: keras.Model, steps: int):
    """The learning-rate schedule and optimizer of the flags; `--weight_decay_mode=l2` adds the
    decay to `model`'s losses. Call inside the distribution scope."""
    F = FLAGS
    if F.weight_decay_mode == "l2":
        optim.add_l2_decay(model, F.weight_decay)
    schedule = optim.Schedule(F.lr_schedule, F.learning_rate, steps, F.warmup_steps)
    optimizer = optim.build_optimizer(
        F.optimizer, schedule, momentum=F.momentum, beta_1=F.adam_beta1,
        beta_2=F.adam_beta2, weight_decay=F.weight_decay,
        weight_decay_mode=F.weight_decay_mode,
        mixed_float16=keras.mixed_precision.dtype_policy().name == "mixed_float16")
    return schedule, optimizer


def pixel_frame(image_size: int) -> list[list[float]]:
    """N^{-1} (3x3 nested lists): model frame -> pixel frame of a square image (conventions.md),
    inverted in float32 from N as `data.homographies.normalization_matrix` has it."""
    n = np.asarray([[2.0 / image_size, 0.0, -(image_size - 1.0) / image_size],
                    [0.0, 2.0 / image_size, -(image_size - 1.0) / image_size],
                    [0.0, 0.0, 1.0]], np.float32)
    return np.linalg.inv(n).tolist()


def load_train_images(split: str = "train"):
    """The stage's images: numpy (N, H, W, 3) uint8 + labels for CIFAR-10, else a tf.data."""
    from aetv2_tf.data.sources import load_source

    data_dir = os.path.expanduser(FLAGS.data_dir) if FLAGS.data_dir else None
    source = load_source(FLAGS.dataset, data_dir, split, download=FLAGS.download)
    if isinstance(source, tuple):
        images, labels = source
        if split == "train" and FLAGS.train_examples:
            images, labels = images[: FLAGS.train_examples], labels[: FLAGS.train_examples]
        return images, labels, len(images)
    if split == "train" and FLAGS.train_examples:
        source = source.take(FLAGS.train_examples)
    size = int(source.cardinality())  # known for tensorflow-datasets splits and folders
    return source, None, size if size >= 0 else None


def total_steps(num_examples: int | None, images_per_step: int) -> tuple[int, int]:
    """(steps per epoch, total steps) from --epochs / --train_steps.

    `images_per_step` is the number of distinct training images a step consumes: the batch for
    AET pairs, a quarter of it for RotNet (each image appears in its 4 rotations).
    """
    if num_examples is None and not FLAGS.train_steps:
        raise UsageError("the dataset size is unknown here: pass --train_steps.")
    per_epoch = max((num_examples or FLAGS.train_steps * images_per_step) // images_per_step, 1)
    steps = FLAGS.train_steps or FLAGS.epochs * per_epoch
    return min(per_epoch, steps), steps


def restore(checkpoint: tf.train.Checkpoint, directory: str, step_fn) -> int:
    """Restores the newest complete checkpoint in `directory`, if any; returns the step to
    continue from. Only a checkpoint listed in `directory/checkpoint` is read, and
    `CheckpointManager` lists one only after all its files are written: a save cut short by a
    crash is never loaded."""
    latest = tf.train.latest_checkpoint(directory)
    if latest is None:
        logging.info("No checkpoint in %s: starting at step 0.", directory)
        return 0
    checkpoint.restore(latest).assert_existing_objects_matched()
    step = step_fn()
    message = f"Resumed from checkpoint {latest} at step {step}."
    logging.info(message)
    print(message, flush=True)
    return step


def pretext_stage(strategy: tf.distribute.Strategy, chief: bool, data=None) -> dict:
    """Self-supervised pretraining (AETv2, AETv1 or RotNet). Returns the end-of-run summary.

    `data` is `load_train_images()`'s result when the caller has already loaded (and so checked)
    the images.
    """
    from aetv2_tf import distribute
    from aetv2_tf.callbacks import (
        CheckpointEvery,
        PretextSummaries,
        StopOnSignal,
        StopOnSkippedStep,
        weights_digest,
    )
    from aetv2_tf.data import pipelines
    from aetv2_tf.data.homographies import parameter_statistics
    from aetv2_tf.export import export_encoder
    from aetv2_tf.models import build_aet_model, build_backbone, build_rotation_model
    from aetv2_tf.visualize import draw_pairs

    F = FLAGS
    images, labels, num_examples = data or load_train_images()
    size = IMAGE_SIZE[F.backbone]
    rotation = F.pretext == "rotation"
    per_epoch, steps = total_steps(num_examples, F.batch_size // 4 if rotation else F.batch_size)

    with strategy.scope():
        encoder = build_backbone(F.backbone, (size, size, 3), batch_norm=F.batch_norm)
        # AETv1: the decoder regresses std-normalised parameters, as the AETv1 code does.
        param_std = parameter_statistics(size, size, F.shift)[1]
        decoder_scale = F.loss == "mse" if F.decoder_scale is None else F.decoder_scale
        model = build_rotation_model(encoder) if rotation else \
            build_aet_model(encoder, param_scale=param_std if decoder_scale else None,
                            init_rotation_deg=F.decoder_init_rotation)
        schedule, optimizer = schedule_and_optimizer(model, steps)
        if rotation:
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
            compiled_metrics = [keras.metrics.SparseCategoricalAccuracy(name="rotation_accuracy")]
        else:
            loss, compiled_metrics = aet_loss(param_std, size, optimizer)
        model.compile(optimizer=optimizer, loss=loss, metrics=compiled_metrics,
                      steps_per_execution=F.steps_per_execution, jit_compile=False)
        optimizer.build(model.trainable_variables)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    distribute.patch_keras_multi_worker_fit(model, strategy)
    step_fn = lambda: int(optimizer.iterations.numpy())  # noqa: E731
    # Every worker saves (saving may need collectives), but only the chief into the model_dir;
    # every worker resumes from the chief's checkpoints (a shared filesystem, see BUILD.md).
    ckpt_dir = os.path.join(F.model_dir, "checkpoints")
    worker_tmp = os.path.join(F.model_dir, ".worker_tmp", distribute.task_name(strategy))
    manager = tf.train.CheckpointManager(checkpoint, ckpt_dir if chief else worker_tmp,
                                         max_to_keep=F.keep_checkpoints)
    start = restore(checkpoint, ckpt_dir, step_fn)

    build = pipelines.rotation_dataset if rotation else pipelines.pretext_dataset
    dataset = build(images, F.batch_size, seed=F.seed, start_step=start, image_size=size,
                    **({} if rotation else {"shift": F.shift, "augment": F.augment}))
    callbacks = [StopOnSignal(), StopOnSkippedStep(optimizer, step_fn, F.on_nonfinite == "stop"),
                 StopAtStep(min(steps, start + F.stop_after_steps) if F.stop_after_steps
                            else steps, step_fn),
                 CheckpointEvery(manager, step_fn, F.checkpoint_every_steps, writer=chief)]
    if chief:
        sample = None if rotation else next(iter(build(
            images, 4, seed=F.seed + 1, image_size=size, shift=F.shift, augment=False)))
        image_mean, image_std = pipelines.normalization_constants(F.dataset)
        callbacks.append(PretextSummaries(
            os.path.join(F.model_dir, "train"), step_fn, lambda s: schedule(s).numpy(),
            F.summary_every_steps, F.image_summary_every_steps or 10 * F.summary_every_steps,
            F.batch_size, sample,
            lambda x, tx, p, q: draw_pairs(x.numpy(), tx.numpy(), p, q, image_mean, image_std)))

    t0 = time.perf_counter()
    history = {}
    if start < steps:
        fit = model.fit(dataset, epochs=math.ceil(steps / per_epoch), steps_per_epoch=per_epoch,
                        initial_epoch=start // per_epoch, callbacks=callbacks, verbose=F.verbose)
        history = {k: float(v[-1]) for k, v in fit.history.items()}
    wall = time.perf_counter() - t0
    done = step_fn()
    summary = dict(steps=done, start_step=start, wall_time_s=round(wall, 1),
                   pairs_per_sec=round((done - start) * F.batch_size / max(wall, 1e-9), 1),
                   **history, trainable_digest=weights_digest(model.trainable_weights))
    interrupted = callbacks[0].received
    if chief and done >= steps and F.export and not interrupted:
        model.save(os.path.join(F.model_dir, "aet_model.keras"))
        export_encoder(encoder, os.path.join(F.model_dir, "export", "encoder"), F.dataset)
        summary["export"] = os.path.join(F.model_dir, "export", "encoder")
    if chief and done >= steps and F.quick_knn_train and not interrupted:
        summary.update(quick_knn_summary(encoder, images, labels))
    if not chief:
        shutil.rmtree(worker_tmp, ignore_errors=True)
        with contextlib.suppress(OSError):  # the last worker out removes the empty parent
            os.rmdir(os.path.dirname(worker_tmp))
    if interrupted:
        summary["interrupted_by"] = interrupted
    if callbacks[1].diverged:
        summary["diverged"] = True
    return summary


def quick_knn_summary(encoder: keras.Model, images, labels) -> dict:
    """`--quick_knn_train/test`: KNN of the trained and of a random-init encoder on a subset."""
    from aetv2_tf.data.pipelines import normalization_constants
    from aetv2_tf.models import build_backbone
    from aetv2_tf.probes.quick import FEATURE, quick_knn

    F = FLAGS
    if labels is None:
        logging.warning("--quick_knn_train: only for CIFAR-10 from its python files; skipped.")
        return {}
    test_images, test_labels, _ = load_train_images("test")
    keras.utils.set_random_seed(F.seed)  # the random init of --pretrained=none, same seed
    size = IMAGE_SIZE[F.backbone]
    random_encoder = build_backbone(F.backbone, (size, size, 3), batch_norm=F.batch_norm)
    n, m = F.quick_knn_train, F.quick_knn_test
    result = quick_knn(encoder, random_encoder, (images[:n], labels[:n]),
                       (test_images[:m], test_labels[:m]), FEATURE[F.backbone],
                       *normalization_constants(F.dataset))
    print(f"Quick KNN (k=10, cosine, {FEATURE[F.backbone]}; first {min(n, len(images))} "
          f"training images vs first {min(m, len(test_images))} test images): "
          f"{result['knn_top1']:.2f}% trained vs {result['random_knn_top1']:.2f}% random init "
          f"({result['knn_gain']:+.2f} points, {result['knn_seconds']:.0f} s).", flush=True)
    return result


class StopAtStep(keras.callbacks.Callback):
    """Ends `fit` at exactly `steps` optimiser steps (epochs may be offset after a resume)."""

    def __init__(self, steps: int, step_fn):
        super().__init__()
        self.steps, self.step_fn = steps, step_fn

    def on_train_batch_end(self, batch, logs=None):
        if self.step_fn() >= self.steps:
            self.model.stop_training = True


def run() -> dict:
    """Sets up devices, precision and the model_dir, then runs the chosen stage."""
    from aetv2_tf import distribute

    F = FLAGS
    distribute.configure_cpu_devices(F.cpu_devices)
    if F.deterministic:
        tf.config.experimental.enable_op_determinism()
    try:  # before any op or variable: multi-worker strategies need a fresh TensorFlow context
        strategy = distribute.get_strategy(F.strategy, F.tpu)
    except ValueError as e:
        raise UsageError(str(e)) from e
    keras.utils.set_random_seed(F.seed)
    check_flags(strategy.num_replicas_in_sync)
    chief = distribute.is_chief(strategy)
    precision = choose_precision(F.mixed_precision)
    keras.mixed_precision.set_global_policy(precision.policy)
    # Bad data fails here, before the model_dir is touched.
    data = load_train_images() if F.stage == "pretext" else None
    recorded = dict(run_flags(), precision=precision._asdict())
    rundir.prepare(F.model_dir, recorded, flagfile_text(), ESSENTIAL, F.overwrite, chief)
    print(start_line(type(strategy).__name__.lstrip("_"), strategy.num_replicas_in_sync,
                     precision, data), flush=True)
    if F.stage == "pretext":
        return pretext_stage(strategy, chief, data)
    from aetv2_tf.probes import stage as probe_stage
    return probe_stage.run(strategy, chief)


def start_line(distribution: str, replicas: int, precision: Choice, data) -> str:
    """One line: what runs, on which data, distribution (strategy) and precision (and why)."""
    F = FLAGS
    if F.stage == "pretext":
        what = "RotNet" if F.pretext == "rotation" else \
            {"geodesic": "AETv2 (geodesic loss)", "mse": "AETv1 (parameter MSE)"}[F.loss]
    else:
        what = f"{F.probe} probe of {F.pretrained}" if F.stage == "probe" else "supervised NIN"
    images = f", {data[2]} training images" if data and data[2] else ""
    return (f"aetv2_tf {F.stage}: {what} | {F.dataset}{images} | "
            f"{distribution} x{replicas} | "
            f"{precision.policy} ({precision.reason}) | {F.model_dir}")


def main(argv) -> None:
    console.configure_logging(FLAGS["verbosity"].present, tensorflow=TENSORFLOW)
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}: every option is a --flag.")
    if TENSORFLOW:
        program = run
    else:  # KERAS_BACKEND=jax (or another non-TensorFlow backend): the portable program
        from aetv2_tf import portable

        program = portable.run
    try:
        summary = program()
    except (UsageError, DataError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    line = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in summary.items())
    print(f"Done ({FLAGS.stage}): {line}. Outputs in {FLAGS.model_dir}", flush=True)
    if summary.get("diverged"):
        print("error: training diverged (every step non-finite); the newest checkpoint is the "
              "last good one. Lower --learning_rate or add --warmup_steps.", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    app.run(main)
