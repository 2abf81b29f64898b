"""The training program on a Keras backend other than TensorFlow (JAX): same command, same flags.

    KERAS_BACKEND=jax python -m aetv2_tf.train --flagfile=configs/cifar10_aetv2.cfg

`aetv2_tf.train.main` runs this module's `run` when `keras.backend.backend()` is not tensorflow;
TensorFlow is then never imported (it need not be installed). What runs:

* `--stage=pretext` (AET: `--loss=geodesic` AETv2 or `mse` AETv1) on CIFAR-10 from its python
  files: `models.pairs.build_pairs_model` (uint8 images -> on-device `HomographyPairs` seeded by
  `--seed` -> the Siamese NIN with Keras BatchNorm -> the decoder of `build_aet_model`), the loss,
  metrics, optimizer, schedule and weight decay that `aetv2_tf.train` builds (its helpers), fed
  by `data.stream.ImageBatches` (uint8 NumPy batches, a pure function of (seed, step)). The train
  step is one jitted function (Keras's), warp included; all local devices are used through
  `keras.distribution.DataParallel` when there are several.
* `--stage=probe --probe=knn` with `--pretrained=<run of either program>|none`
  (`probes.knn_numpy`), writing the same `results.json` as the TensorFlow probe.

Outputs in `--model_dir`: flags.cfg / flags.json (with `backend`), Keras checkpoints
(`keras_checkpoints`: checkpoints/ckpt-<step>.weights.h5, atomic, `--keep_checkpoints` newest;
rerunning the command resumes at the same step, learning rate, data position and sampler state),
train/log.csv (loss, metrics, learning rate, pairs/s every `--summary_every_steps`; TensorBoard
scalars too when TensorFlow is importable), and at the end encoder.weights.h5, which
`--pretrained=<model_dir>` and `python -m aetv2_tf.export --model_dir=<model_dir>` load under
TensorFlow. Differences from the TensorFlow program: BatchNorm is always Keras's (`--batch_norm=
fused` is TensorFlow's kernel of the same computation, with interchangeable weights, so it is
replaced, and the start line says so); no SavedModel export and no image summaries (TensorFlow
things); `--mixed_precision=auto` is mixed_bfloat16 on a GPU/TPU, float32 on a CPU. The decoder
scale and the MSE normalisation use the parameter std measured with the device sampler.
"""

from __future__ import annotations

import math
import os
import time

import keras
import numpy as np
from absl import logging

from aetv2_tf import rundir
from aetv2_tf.flags import ESSENTIAL, FLAGS, flagfile_text, run_flags
from aetv2_tf.precision import Choice, choose_precision
from aetv2_tf.rundir import UsageError

PAIRS_FEATURE = "block2"


def check_flags(num_devices: int) -> None:
    """The TensorFlow program's checks, then what only TensorFlow can run (each names the fix)."""
    from aetv2_tf import train

    F = FLAGS
    backend = keras.backend.backend()
    train.check_common_flags(num_devices)
    tf_only = {
        "strategy": (F.strategy not in ("auto", "default"),
                     "uses every local device by itself (keras.distribution.DataParallel); "
                     "drop --strategy or pass --strategy=auto"),
        "tpu": (bool(F.tpu), "is tf.distribute's TPU resolver; drop --tpu (JAX finds TPUs)"),
        "cpu_devices": (F.cpu_devices != 1, "splits a CPU in tf.config; drop it (1)"),
        "deterministic": (F.deterministic, "is TensorFlow's op determinism; drop it "
                          "(XLA_FLAGS=--xla_gpu_deterministic_ops=true on JAX GPUs)"),
        "dataset": (F.dataset != "cifar10", "other than cifar10 reads tensorflow-datasets or "
                    "tf.data folders; use --dataset=cifar10 or the TensorFlow backend"),
        "pretext": (F.pretext != "aet", "=rotation (RotNet) is the TensorFlow program's; pass "
                    "--pretext=aet"),
        "stage": (F.stage == "supervised" or (F.stage == "probe" and F.probe != "knn"),
                  "only pretext and --stage=probe --probe=knn run here; use the TensorFlow "
                  "backend for heads and the supervised stage"),
    }
    for flag, (bad, fix) in tf_only.items():
        if bad:
            raise UsageError(f"--{flag}={getattr(F, flag)} is not available with "
                             f"KERAS_BACKEND={backend}: it {fix} (or run with "
                             "KERAS_BACKEND=tensorflow).")
    if F.stage == "probe":
        from aetv2_tf.probes import encoders

        encoders.resolve_feature(F.backbone, F.feature)
        encoders.check_pretrained(F.pretrained, F.backbone)


def choose_portable_precision(name: str) -> Choice:
    """`--mixed_precision` here: explicit policies pass through; `auto` is mixed_bfloat16 on a
    GPU or TPU (the fast type of their matrix units), float32 on a CPU."""
    if name != "auto":
        return choose_precision(name)
    platforms = {d.split(":")[0].lower() for d in keras.distribution.list_devices()}
    accelerator = sorted(platforms & {"gpu", "cuda", "rocm", "tpu"})
    if accelerator:
        return Choice("mixed_bfloat16", f"auto: {accelerator[0].upper()}")
    return Choice("float32", "auto: CPU under " + keras.backend.backend())


def parameter_std(size: int, shift: str, samples: int = 200_000) -> np.ndarray:
    """(8,) float32 std of the sampler's parameters (fixed seed), as the decoder scale."""
    from aetv2_tf.data.device import matrix_to_params, sample_homographies

    t, _ = sample_homographies(samples, size, size, 1234, shift)
    return keras.ops.convert_to_numpy(matrix_to_params(t)).astype(np.float64).std(0) \
        .astype(np.float32)


def run() -> dict:
    """`aetv2_tf.train.run` for this backend: devices, precision, model_dir, then the stage."""
    from aetv2_tf import train

    F = FLAGS
    devices = keras.distribution.list_devices()
    keras.utils.set_random_seed(F.seed)
    check_flags(len(devices))
    if len(devices) > 1:
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    precision = choose_portable_precision(F.mixed_precision)
    keras.mixed_precision.set_global_policy(precision.policy)
    data = train.load_train_images() if F.stage == "pretext" else None
    recorded = dict(run_flags(), precision=precision._asdict(), backend=keras.backend.backend())
    rundir.prepare(F.model_dir, recorded, flagfile_text(), ESSENTIAL, F.overwrite)
    distribution = "DataParallel" if len(devices) > 1 else "OneDevice"
    note = " | batch norm: keras" if F.batch_norm != "keras" else ""
    print(train.start_line(f"{keras.backend.backend()} {distribution}", len(devices), precision,
                           data) + note, flush=True)
    if F.stage == "pretext":
        return pretext_stage(data)
    from aetv2_tf.portable_probe import knn_stage

    return knn_stage()


def pretext_stage(data) -> dict:
    """AET pretraining (module docstring); returns the summary `train.main` prints."""
    from aetv2_tf import train
    from aetv2_tf.callbacks import StopOnSignal
    from aetv2_tf.data.device import CIFAR10_MEAN, CIFAR10_STD
    from aetv2_tf.data.stream import ImageBatches
    from aetv2_tf.keras_checkpoints import (
        ENCODER_WEIGHTS,
        SaveEvery,
        StepCounter,
        encoder_digest,
        restore_checkpoint,
        save_atomically,
    )
    from aetv2_tf.models import build_backbone
    from aetv2_tf.models.pairs import build_pairs_model

    F = FLAGS
    images, labels, num_examples = data
    size = train.IMAGE_SIZE[F.backbone]
    per_epoch, steps = train.total_steps(num_examples, F.batch_size)
    encoder = build_backbone(F.backbone, (size, size, 3), batch_norm="keras")
    param_std = parameter_std(size, F.shift)
    decoder_scale = F.loss == "mse" if F.decoder_scale is None else F.decoder_scale
    model = build_pairs_model(encoder, F.seed, shift=F.shift, augment=F.augment,
                              mean=CIFAR10_MEAN, std=CIFAR10_STD,
                              param_scale=param_std if decoder_scale else None,
                              init_rotation_deg=F.decoder_init_rotation,
                              count_steps=F.mse_decay_steps > 0)
    schedule, optimizer = train.schedule_and_optimizer(model, steps)
    loss, compiled_metrics = train.aet_loss(param_std, size, optimizer)
    if model.loss_step is not None:  # the step a jitted JAX step carries (models.pairs)
        loss.step = model.loss_step
    model.compile(optimizer=optimizer, loss=loss, metrics=compiled_metrics,
                  steps_per_execution=F.steps_per_execution)
    optimizer.build(model.trainable_variables)
    ckpt_dir = os.path.join(F.model_dir, "checkpoints")
    start = restore_checkpoint(model, ckpt_dir)
    stop = min(steps, start + F.stop_after_steps) if F.stop_after_steps else steps
    counter = StepCounter(start)
    callbacks = [counter, StopOnSignal(), train.StopAtStep(stop, counter),
                 SaveEvery(ckpt_dir, counter, F.checkpoint_every_steps, F.keep_checkpoints),
                 *summary_callbacks(counter, schedule)]

    t0 = time.perf_counter()
    history = {}
    if start < stop:
        batches = ImageBatches(images, F.batch_size, F.seed, start, stop)
        per_fit_epoch = min(per_epoch, stop - start)
        fit = model.fit(batches, epochs=math.ceil((stop - start) / per_fit_epoch),
                        steps_per_epoch=per_fit_epoch, shuffle=False, callbacks=callbacks,
                        verbose=F.verbose)
        history = {k: float(v[-1]) for k, v in fit.history.items()}
    wall = time.perf_counter() - t0
    done = counter()
    summary = dict(steps=done, start_step=start, wall_time_s=round(wall, 1),
                   pairs_per_sec=round((done - start) * F.batch_size / max(wall, 1e-9), 1),
                   **history, trainable_digest=encoder_digest(model))
    skipped = getattr(optimizer, "skipped_steps", None)
    if skipped is not None and int(keras.ops.convert_to_numpy(skipped)):
        summary["skipped_steps"] = int(keras.ops.convert_to_numpy(skipped))
    interrupted = callbacks[1].received
    if done >= steps and not interrupted:
        summary["encoder_weights"] = save_atomically(
            encoder.save_weights, os.path.join(F.model_dir, ENCODER_WEIGHTS))
        if F.quick_knn_train:
            from aetv2_tf.portable_probe import quick_knn_summary

            summary.update(quick_knn_summary(encoder, images, labels))
    if interrupted:
        summary["interrupted_by"] = interrupted
    return summary


def summary_callbacks(counter, schedule) -> list[keras.callbacks.Callback]:
    """The scalar logs of `callbacks.PretextSummaries` (interval means, learning rate, pairs/s):
    rows of train/log.csv always, TensorBoard scalars too when TensorFlow is importable (kept on
    the CPU: it must not take the accelerator's memory)."""
    from aetv2_tf.callbacks import PretextSummaries

    F = FLAGS
    log_dir = os.path.join(F.model_dir, "train")
    lr_fn = lambda step: float(keras.ops.convert_to_numpy(schedule(step)))  # noqa: E731
    args = (log_dir, counter, lr_fn, F.summary_every_steps, 0, F.batch_size)

    class Csv(PretextSummaries):
        def _create_writer(self, directory):
            os.makedirs(directory, exist_ok=True)
            return _CsvWriter(os.path.join(directory, "log.csv"))

        def _write_scalars(self, step, row):
            self.writer.write(step, row)

    out = [Csv(*args)]
    try:
        import tensorflow as tf

        tf.config.set_visible_devices([], "GPU")
        out.append(PretextSummaries(*args))
    except Exception as e:  # noqa: BLE001 - absent, blocked or unusable: the CSV is enough
        logging.info("No TensorBoard scalars (%s); train/log.csv has them.", e)
    return out


class _CsvWriter:
    """Appends `step,<scalars>` rows to a CSV file (header once; a resumed run appends)."""

    COLUMNS = ("step", "loss", "geodesic_angle_deg", "projection_residual", "rotation_accuracy",
               "learning_rate", "pairs_per_sec")

    def __init__(self, path: str):
        self.path = path
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(",".join(self.COLUMNS) + "\n")

    def write(self, step: int, row: dict) -> None:
        values = dict(row)
        with open(self.path, "a") as f:
            f.write(",".join([str(step)] + [f"{values[c]:.6g}" if c in values else ""
                                            for c in self.COLUMNS[1:]]) + "\n")

    def flush(self) -> None:
        pass
