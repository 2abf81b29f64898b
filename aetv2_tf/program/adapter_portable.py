"""The JAX adapter of the training program (any Keras backend but TensorFlow): same command,
same flags; `aetv2_tf.train.main` runs this module's `run` when `keras.backend.backend()` is not
tensorflow, and TensorFlow is then never imported (it need not be installed).

    KERAS_BACKEND=jax python -m aetv2_tf.train --flagfile=configs/cifar10_aetv2.cfg

What is this backend's own (`KerasPretext`, the adapter of the one pretext loop
`program.pretext`; the rest is `program.common`, shared with TensorFlow's adapter):

* input: `data.stream.ImageBatches` (uint8 NumPy batches, a pure function of (seed, step)); the
  pretext examples are made on the device inside the jitted step (`models.pairs`: the
  homography pairs of AET, `--loss=geodesic` AETv2 or `mse` AETv1, or the 4 rotations of
  RotNet, `--pretext=rotation`), seeded by `--seed`;
* distribution: every local device through `keras.distribution.DataParallel`;
* checkpoints: Keras `.weights.h5` files (`keras_checkpoints`, atomic, `--keep_checkpoints`
  newest; rerunning the command resumes at the same step, learning rate, data position and
  sampler state);
* summaries: train/log.csv (TensorBoard scalars too where TensorFlow is importable);
* export: `--export` runs `python -m aetv2_tf.export` on the TensorFlow backend in a child
  process where TensorFlow is importable (`export_saved_model`);
* BatchNorm is always Keras's (`--batch_norm=fused` is TensorFlow's kernel of the same
  computation, with interchangeable weights; the start line says so); the decoder scale and the
  MSE normalisation use the parameter std measured with the device sampler.

`--stage=probe` (KNN and every classifier head) and `--stage=supervised` run `probe_stage.run`,
the stage of both adapters (its input adapter: NumPy batches, crops and flips on the device).
Which flag values run here is `aetv2_tf.program.flag_support`'s table.
"""

from __future__ import annotations

import os

import keras
import numpy as np
from absl import logging

from aetv2_tf import __version__
from aetv2_tf.data.sampler import parameter_std
from aetv2_tf.errors import UsageError
from aetv2_tf.program import common as program
from aetv2_tf.program import pretext, rundir
from aetv2_tf.program.flags import ESSENTIAL, FLAGS, TRAJECTORY, flagfile_text, run_flags
from aetv2_tf.program.precision import choose_precision


def check_flags(num_devices: int) -> None:
    """`program.check_flags` for this backend (its flag-support table), then the probe stages'
    own checks (`probe_stage.check_flags`, as under TensorFlow)."""
    F = FLAGS
    program.check_flags(num_devices, keras.backend.backend(), accelerator=_accelerator() != "")
    if F.stage == "pretext" and F.pretext == "rotation" and F.batch_size % (4 * num_devices):
        raise UsageError(f"--pretext=rotation feeds --batch_size/4 images a step, split over "
                         f"the {num_devices} devices: --batch_size={F.batch_size} must be a "
                         f"multiple of {4 * num_devices}.")
    if F.stage != "pretext":
        from aetv2_tf.program.probe_stage import check_flags as check_probe_flags

        check_probe_flags()


def _accelerator() -> str:
    """"tpu", "gpu" (CUDA, ROCm) or "" (a CPU): the local devices' platform."""
    platforms = {d.split(":")[0].lower() for d in keras.distribution.list_devices()}
    if "tpu" in platforms:
        return "tpu"
    return "gpu" if platforms & {"gpu", "cuda", "rocm"} else ""


def run() -> dict:
    """`adapter_tensorflow.run` for this backend: devices, precision, model_dir, then the stage."""
    from aetv2_tf.program.flag_support import tensorflow_importable

    F = FLAGS
    tensorflow_importable()  # Keras seeds TensorFlow too where it is there: import it quietly
    devices = keras.distribution.list_devices()
    keras.utils.set_random_seed(F.seed)
    check_flags(len(devices))
    if len(devices) > 1:
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    precision = choose_precision(F.mixed_precision, keras.backend.backend(), _accelerator())
    keras.mixed_precision.set_global_policy(precision.policy)
    data = program.load_train_images() if F.stage == "pretext" else None
    if data is not None:
        pretext.check_batch_fits(data[2], accelerator=_accelerator() != "")
    from aetv2_tf.program import probe_stage
    # A probe reads its data and --pretrained encoder here too: a failure writes nothing.
    loaded = probe_stage.load() if F.stage != "pretext" else None
    program.continue_earlier_run()
    recorded = dict(run_flags(), version=__version__, precision=precision._asdict(),
                    backend=keras.backend.backend())
    rundir.prepare(F.model_dir, recorded, flagfile_text(), ESSENTIAL, F.overwrite,
                   trajectory=TRAJECTORY)
    distribution = "DataParallel" if len(devices) > 1 else "OneDevice"
    note = " | batch norm: keras" if F.batch_norm != "keras" else ""
    print(program.start_line(f"{keras.backend.backend()} {distribution}", len(devices), precision,
                           data) + note, flush=True)
    if F.stage == "pretext":
        return pretext.run(KerasPretext(data[0]), *data)
    return probe_stage.run(loaded=loaded)


class KerasPretext(pretext.PretextAdapter):
    """The adapter of `program.pretext` on this backend (module docstring): uint8 NumPy
    batches (`data.stream.ImageBatches`, a pure function of (seed, step)), the pairs or
    rotations made on the device inside the jitted step (`models.pairs`), Keras `.weights.h5`
    checkpoints, the CSV (and TensorBoard) summaries, the export through a TensorFlow child
    process."""

    fit_kwargs = {"shuffle": False}  # the batches are already in their order

    def __init__(self, images):
        F = FLAGS
        super().__init__(images)
        self.param_std = None if self.rotation else parameter_std(self.size, F.shift)
        # Reading the skip counter waits for the device: every step only with --on_nonfinite=stop.
        self.skip_check_every = 1 if F.on_nonfinite == "stop" else F.summary_every_steps

    @property
    def files(self) -> bool:
        """The images are a folder's file list (decoded by the reader's threads, which crop and
        flip them by the 224-pixel protocol: the device then does not augment again)."""
        from aetv2_tf.data.files import ImageFiles

        return isinstance(self.images, ImageFiles)

    def batches(self, start: int, stop: int):
        from aetv2_tf.data.stream import FileBatches, ImageBatches

        if self.files:  # Pillow releases the GIL: threads decode in parallel
            return FileBatches(self.images, self.images_per_step, FLAGS.seed, start, stop,
                               self.size, FLAGS.augment, workers=min(os.cpu_count() or 1, 32))
        return ImageBatches(self.images, self.images_per_step, FLAGS.seed, start, stop)

    def build(self, steps: int):
        from aetv2_tf.models import build_backbone
        from aetv2_tf.models.pairs import build_pairs_model, build_rotations_model

        F = FLAGS
        keras.utils.set_random_seed(F.seed)  # the same weights whatever was built before
        encoder = build_backbone(F.backbone, (self.size, self.size, 3), batch_norm="keras")
        augment = F.augment and not self.files
        if self.rotation:
            model = build_rotations_model(encoder, F.seed, augment=augment,
                                          mean=self.mean, std=self.std)
        else:
            model = build_pairs_model(encoder, F.seed, shift=F.shift, augment=augment,
                                      mean=self.mean, std=self.std,
                                      init_rotation_deg=F.decoder_init_rotation,
                                      siamese_batch_norm=F.siamese_batch_norm,
                                      count_steps=F.mse_decay_steps > 0,
                                      **program.recipe().decoder_options(
                                          self.size, F.shift, F.decoder_scale, self.param_std))
        schedule, optimizer = program.schedule_and_optimizer(model, steps)
        # An MSE warm-up reads the step a jitted JAX step carries (models.pairs).
        loss, compiled_metrics = program.pretext_loss(self.param_std, self.size, model.loss_step)
        model.compile(optimizer=optimizer, loss=loss, metrics=compiled_metrics,
                      steps_per_execution=F.steps_per_execution)
        optimizer.build(model.trainable_variables)
        return encoder, model, schedule, optimizer

    def checkpoints(self, model, optimizer):
        from aetv2_tf.program.keras_checkpoints import KerasCheckpoints, restore_checkpoint

        directory = os.path.join(FLAGS.model_dir, "checkpoints")
        return KerasCheckpoints(directory, FLAGS.keep_checkpoints), \
            restore_checkpoint(model, directory)

    def summaries(self, counter, schedule):
        from aetv2_tf.data.stream import load_crop

        sample = np.stack([load_crop(p, self.size, None) for p in self.images.paths[:4]]) \
            if self.files else self.images[:4]
        return summary_callbacks(counter, schedule, sample, self.mean, self.std)

    def export(self, encoder, model) -> dict:
        return export_saved_model()


def export_saved_model() -> dict:
    """`--export` here: the SavedModel is TensorFlow's, so `python -m aetv2_tf.export` runs on
    the TensorFlow backend in a child process, from `encoder.weights.h5` (the flag-support
    table refuses an explicit --export where TensorFlow is not importable; by default the
    export is then left out, and the summary says so)."""
    import subprocess
    import sys

    from aetv2_tf.program.flag_support import tensorflow_importable

    if not tensorflow_importable():
        return {"export": "none (TensorFlow is not importable here)"}
    out = os.path.join(FLAGS.model_dir, "export", "encoder")
    # On the CPU: the accelerator's memory is JAX's.
    env = dict(os.environ, KERAS_BACKEND="tensorflow", CUDA_VISIBLE_DEVICES="",
               TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    proc = subprocess.run([sys.executable, "-m", "aetv2_tf.export",
                           f"--model_dir={FLAGS.model_dir}", f"--output={out}"], env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        logging.error("SavedModel export failed (exit %d): %s", proc.returncode,
                      proc.stderr[-2000:])
        return {"export": f"FAILED (exit {proc.returncode}); retry with python -m "
                          f"aetv2_tf.export --model_dir={FLAGS.model_dir}"}
    return {"export": out}


def summary_callbacks(counter, schedule, sample, mean, std) -> list[keras.callbacks.Callback]:
    """The logs of `callbacks.PretextSummaries` (interval means, learning rate, pairs/s): rows of
    train/log.csv always; where TensorFlow is importable also TensorBoard, its scalars and (AET)
    the image pairs of the 4 training images `sample` every `--image_summary_every_steps` (kept on
    the CPU: it must not take the accelerator's memory), normalised with `mean`, `std`."""
    from aetv2_tf.program.callbacks import PretextSummaries
    from aetv2_tf.summaries import CsvLog

    F = FLAGS
    log_dir = os.path.join(F.model_dir, "train")
    lr_fn = lambda step: float(keras.ops.convert_to_numpy(schedule(step)))  # noqa: E731
    args = (log_dir, counter, lr_fn, F.summary_every_steps, 0, F.batch_size)

    class Csv(PretextSummaries):
        def _create_writer(self, directory):
            return CsvLog(os.path.join(directory, "log.csv"),
                          (*self.SCALARS, "learning_rate", "pairs_per_sec"))

        def _write_scalars(self, step, row):
            self.writer.write(step, row)

    class Pairs(PretextSummaries):
        def _predict(self, inputs):  # the decoder: the pairs model's inner AET model
            aet = self.model.get_layer("aet")  # (the property syncs the JAX state)
            return keras.ops.convert_to_numpy(aet(list(inputs), training=False)).astype(
                np.float32)

    out = [Csv(*args)]
    from aetv2_tf.program.flag_support import tensorflow_importable

    try:
        if not tensorflow_importable():  # (imported there, quietly)
            raise ImportError("TensorFlow is not importable")
        import tensorflow as tf

        tf.config.set_visible_devices([], "GPU")
    except Exception as e:  # noqa: BLE001 - absent, blocked or unusable: the CSV is enough
        logging.info("No TensorBoard summaries (%s); train/log.csv has the scalars.", e)
        return out
    if F.pretext == "rotation":
        return out + [PretextSummaries(*args)]
    from aetv2_tf.data.layers import HomographyPairs
    from aetv2_tf.visualize import draw_pairs

    x, tx, params = HomographyPairs(seed=F.seed + 1, shift=F.shift, augment=False, mean=mean,
                                    std=std)(sample)
    sample = (np.asarray(x), np.asarray(tx)), np.asarray(params)
    return out + [Pairs(*args[:4], F.image_summary_every_steps or 10 * F.summary_every_steps,
                        F.batch_size, sample, lambda x, tx, p, q: draw_pairs(
                            x, tx, p, q, mean, std))]
