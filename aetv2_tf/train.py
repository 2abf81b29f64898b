"""The training program: `python -m aetv2_tf.train --flagfile=configs/<experiment>.cfg`.

One absl entry point for every stage (see `aetv2_tf/flags.py` or `--helpfull`):

- `--stage=pretext`: self-supervised pretraining, AETv2 (`--loss=geodesic`), AETv1
  (`--loss=mse`) or RotNet (`--pretext=rotation`);
- `--stage=probe`: a frozen encoder evaluated by KNN or a trained classifier head;
- `--stage=supervised`: the fully supervised NIN baseline.

Everything a run produces lives under `--model_dir` (layout in `aetv2_tf/rundir.py`); rerunning
the same command resumes from the newest checkpoint, at the same step and learning rate.

One program with backend adapters (BUILD.md): the backend-neutral parts are
`aetv2_tf.program`; the Keras backend chooses the adapter in `main`: TensorFlow (the default)
runs this module's (tf.distribute, tf.data, TensorBoard, SavedModel export), any other backend
(`KERAS_BACKEND=jax`) `aetv2_tf.portable`, with the same flags. That one needs no TensorFlow (the
module and `--helpfull` load without it) and uses it where it is importable (TensorBoard, the
SavedModel export in a child process).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys

from aetv2_tf import console

with console.quiet_native_stderr(not console.verbose_requested()):
    import keras

    TENSORFLOW = keras.backend.backend() == "tensorflow"
    if TENSORFLOW:  # other backends run aetv2_tf.portable and never import TensorFlow
        import tensorflow as tf
from absl import app, logging

from aetv2_tf import program, rundir
from aetv2_tf.data.sources import DataError
from aetv2_tf.flags import ESSENTIAL, FLAGS, flagfile_text, run_flags
from aetv2_tf.precision import choose_precision
from aetv2_tf.rundir import UsageError


def check_flags(num_replicas: int) -> None:
    """`program.check_flags` for TensorFlow, then the probe stages' own checks."""
    program.check_flags(num_replicas, "tensorflow",
                        accelerator=bool(tf.config.list_logical_devices("GPU")))
    if FLAGS.stage != "pretext":
        from aetv2_tf.probes.stage import check_flags as check_probe_flags

        check_probe_flags()


def restore(checkpoint: tf.train.Checkpoint, directory: str) -> int:
    """Restores the newest complete checkpoint in `directory`, if any; returns its step (the
    batches consumed, the number in its name), 0 when there is none. Only a checkpoint listed in
    `directory/checkpoint` is read, and `CheckpointManager` lists one only after all its files
    are written: a save cut short by a crash is never loaded."""
    latest = tf.train.latest_checkpoint(directory)
    if latest is None:
        logging.info("No checkpoint in %s: starting at step 0.", directory)
        return 0
    checkpoint.restore(latest).assert_existing_objects_matched()
    step = int(latest.rsplit("-", 1)[-1])
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
        StepCounter,
        StopOnSignal,
        StopOnSkippedStep,
    )
    from aetv2_tf.data import pipelines
    from aetv2_tf.data.constants import normalization_constants
    from aetv2_tf.data.homographies import parameter_statistics
    from aetv2_tf.export import export_encoder
    from aetv2_tf.keras_checkpoints import discard_encoder_weights, save_encoder_weights
    from aetv2_tf.models import build_aet_model, build_backbone, build_rotation_model
    from aetv2_tf.visualize import draw_pairs

    F = FLAGS
    images, labels, num_examples = data or program.load_train_images()
    size = program.IMAGE_SIZE[F.backbone]
    rotation = F.pretext == "rotation"
    # AETv1: the decoder regresses std-normalised parameters, as the AETv1 code does.
    param_std = parameter_statistics(size, size, F.shift)[1]
    build_data = pipelines.rotation_dataset if rotation else pipelines.pretext_dataset

    def dataset_from(step: int, batch_size: int = F.batch_size, **kwargs):
        options = {} if rotation else {"shift": F.shift, "augment": F.augment}
        return build_data(images, batch_size, image_size=size, **{
            "seed": F.seed, "start_step": step, **options, **kwargs})

    def build(steps: int):
        """The encoder, compiled pretext model, schedule and optimizer of a `steps`-step run."""
        keras.utils.set_random_seed(F.seed)  # the same weights whatever was built before
        with strategy.scope():
            encoder = build_backbone(F.backbone, (size, size, 3), batch_norm=F.batch_norm)
            decoder_scale = F.loss == "mse" if F.decoder_scale is None else F.decoder_scale
            model = build_rotation_model(encoder) if rotation else \
                build_aet_model(encoder, param_scale=param_std if decoder_scale else None,
                                init_rotation_deg=F.decoder_init_rotation)
            schedule, optimizer = program.schedule_and_optimizer(model, steps)
            loss, compiled_metrics = program.pretext_loss(param_std, size, optimizer.iterations)
            model.compile(optimizer=optimizer, loss=loss, metrics=compiled_metrics,
                          steps_per_execution=F.steps_per_execution, jit_compile=False)
            optimizer.build(model.trainable_variables)
        distribute.patch_keras_multi_worker_fit(model, strategy)
        return encoder, model, schedule, optimizer

    def fit_first_steps(n: int, timer: keras.callbacks.Callback) -> None:
        build(n)[1].fit(dataset_from(0).take(n), epochs=1, steps_per_epoch=n,
                        callbacks=[timer], verbose=0)

    budget = program.budget_steps(fit_first_steps, writer=chief) if F.train_seconds else 0
    per_epoch, steps = program.total_steps(
        num_examples, F.batch_size // 4 if rotation else F.batch_size, budget)
    encoder, model, schedule, optimizer = build(steps)
    with strategy.scope():
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    # Every worker saves (saving may need collectives), but only the chief into the model_dir;
    # every worker resumes from the chief's checkpoints (a shared filesystem, see BUILD.md).
    ckpt_dir = os.path.join(F.model_dir, "checkpoints")
    worker_tmp = os.path.join(F.model_dir, ".worker_tmp", distribute.task_name(strategy))
    manager = tf.train.CheckpointManager(checkpoint, ckpt_dir if chief else worker_tmp,
                                         max_to_keep=F.keep_checkpoints)
    start = restore(checkpoint, ckpt_dir)
    stop = program.stop_step(start, steps)
    step_fn = StepCounter(start, stop)  # batches consumed: the data position and checkpoint name

    dataset = dataset_from(start)
    signals = StopOnSignal()
    skips = StopOnSkippedStep(optimizer, step_fn, F.on_nonfinite == "stop")
    callbacks = [step_fn, signals, skips, program.StopAtStep(stop, step_fn),
                 CheckpointEvery(manager, step_fn, F.checkpoint_every_steps, writer=chief)]
    if chief:
        sample = None if rotation else next(iter(dataset_from(
            0, batch_size=4, seed=F.seed + 1, augment=False)))
        image_mean, image_std = normalization_constants(F.dataset)
        callbacks.append(PretextSummaries(
            os.path.join(F.model_dir, "train"), step_fn, lambda s: schedule(s).numpy(),
            F.summary_every_steps, F.image_summary_every_steps or 10 * F.summary_every_steps,
            F.batch_size, sample,
            lambda x, tx, p, q: draw_pairs(x.numpy(), tx.numpy(), p, q, image_mean, image_std)))

    if chief and start < stop:
        discard_encoder_weights(F.model_dir)  # it would describe an older end of the run
    summary, finished = program.fit_and_summarize(model, dataset.take(stop - start), start, stop,
                                                  steps, per_epoch, callbacks)
    if chief and finished:
        summary["encoder_weights"] = save_encoder_weights(encoder, F.backbone, F.model_dir)
        if F.export:
            model.save(os.path.join(F.model_dir, "aet_model.keras"))
            export_encoder(encoder, os.path.join(F.model_dir, "export", "encoder"), F.dataset)
            summary["export"] = os.path.join(F.model_dir, "export", "encoder")
        if F.quick_knn_train:
            summary.update(program.quick_knn_summary(encoder, images, labels))
    if not chief:
        shutil.rmtree(worker_tmp, ignore_errors=True)
        with contextlib.suppress(OSError):  # the last worker out removes the empty parent
            os.rmdir(os.path.dirname(worker_tmp))
    return summary


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
    accelerator = "tpu" if tf.config.list_logical_devices("TPU") else \
        "gpu" if tf.config.list_logical_devices("GPU") else ""
    precision = choose_precision(F.mixed_precision, "tensorflow", accelerator)
    keras.mixed_precision.set_global_policy(precision.policy)
    # Bad data fails here, before the model_dir is touched.
    data = program.load_train_images() if F.stage == "pretext" else None
    recorded = dict(run_flags(), precision=precision._asdict())
    rundir.prepare(F.model_dir, recorded, flagfile_text(), ESSENTIAL, F.overwrite, chief)
    print(program.start_line(type(strategy).__name__.lstrip("_"), strategy.num_replicas_in_sync,
                     precision, data), flush=True)
    if F.stage == "pretext":
        return pretext_stage(strategy, chief, data)
    from aetv2_tf.probes import stage as probe_stage
    return probe_stage.run(strategy, chief)


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
    sys.exit(exit_code(summary))


#: Exit codes (docs/reliability.md): 0 done, 1 absl flag errors, 2 refused input, 3 non-finite
#: training, 128 + N stopped by signal N (SIGTERM 143, SIGINT 130) after a final checkpoint.
EXIT_NONFINITE = 3


def exit_code(summary: dict) -> int:
    """The exit status of a stage's `summary`, with the last line a script needs to act on."""
    if summary.get("interrupted_by"):
        sig = signal.Signals[summary["interrupted_by"]]
        print(f"Stopped by {sig.name} at step {summary.get('steps')} after writing a checkpoint: "
              f"the run is NOT finished; rerun the same command to resume (exit "
              f"{128 + sig.value}).", flush=True)
        return 128 + sig.value
    if summary.get("diverged"):
        print("error: training diverged (every step non-finite); the newest checkpoint is the "
              "last good one. Lower --learning_rate or add --warmup_steps.", file=sys.stderr)
        return EXIT_NONFINITE
    if summary.get("nonfinite_weights"):
        print("error: non-finite weights (e.g. NaN images made the BatchNorm statistics NaN): "
              "no checkpoint was written for them and training stopped; the newest checkpoint "
              "is the last good one. Check the data, lower --learning_rate.", file=sys.stderr)
        return EXIT_NONFINITE
    if summary.get("stopped_nonfinite"):
        print("error: --on_nonfinite=stop ended training at a non-finite step; the newest "
              "checkpoint is the last good one. Lower --learning_rate, add --warmup_steps, or "
              "pass --on_nonfinite=skip.", file=sys.stderr)
        return EXIT_NONFINITE
    return 0


if __name__ == "__main__":
    app.run(main)
