"""The JAX adapter of the training program (any Keras backend but TensorFlow): same command,
same flags; `aetv2_tf.train.main` runs this module's `run` when `keras.backend.backend()` is not
tensorflow, and TensorFlow is then never imported (it need not be installed).

    KERAS_BACKEND=jax python -m aetv2_tf.train --flagfile=configs/cifar10_aetv2.cfg

What is this backend's own (`KerasPretext`, the adapter of the one pretext loop
`program.pretext_stage`; the rest is `program.common`, shared with TensorFlow's adapter):

* input: `data.stream.ImageBatches` (uint8 NumPy batches, a pure function of (seed, step)); the
  pretext examples are made on the device inside the jitted step (`models.pretext`: the
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

from aetv2_tf.errors import UsageError
from aetv2_tf.program import common as program
from aetv2_tf.program import config as run_config
from aetv2_tf.program import pretext_stage, rundir
from aetv2_tf.program.config import RunConfig
from aetv2_tf.program.flags import ESSENTIAL, TRAJECTORY
from aetv2_tf.program.precision import choose_precision


def check_machine(config: RunConfig, num_devices: int) -> None:
    """`config.check_machine` for this backend (its flag-support table), and RotNet's batch
    against the devices."""
    run_config.check_machine(config, num_devices, keras.backend.backend(),
                             accelerator=_accelerator() != "")
    batch = config.train.batch_size
    if config.stage == "pretext" and config.pretext == "rotation" and batch % (4 * num_devices):
        raise UsageError(f"--pretext=rotation feeds --batch_size/4 images a step, split over "
                         f"the {num_devices} devices: --batch_size={batch} must be a "
                         f"multiple of {4 * num_devices}.")


def _accelerator() -> str:
    """"tpu", "gpu" (CUDA, ROCm) or "" (a CPU): the local devices' platform."""
    platforms = {d.split(":")[0].lower() for d in keras.distribution.list_devices()}
    if "tpu" in platforms:
        return "tpu"
    return "gpu" if platforms & {"gpu", "cuda", "rocm"} else ""


def run(config: RunConfig) -> dict:
    """`adapter_tensorflow.run` for this backend: devices, precision, model_dir, then the stage."""
    from aetv2_tf.program.flag_support import tensorflow_importable

    tensorflow_importable()  # Keras seeds TensorFlow too where it is there: import it quietly
    devices = keras.distribution.list_devices()
    keras.utils.set_random_seed(config.train.seed)
    check_machine(config, len(devices))
    if len(devices) > 1:
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    precision = choose_precision(config.machine.mixed_precision, keras.backend.backend(),
                                 _accelerator())
    keras.mixed_precision.set_global_policy(precision.policy)
    data = program.load_train_images(config) if config.stage == "pretext" else None
    if data is not None:
        pretext_stage.check_batch_fits(config, data[2], accelerator=_accelerator() != "")
    from aetv2_tf.program import probe_stage
    # A probe reads its data and --pretrained encoder here too: a failure writes nothing.
    loaded = probe_stage.load(config) if config.stage != "pretext" else None
    rundir.prepare(config.outputs.model_dir,
                   config.recorded(precision._asdict(), backend=keras.backend.backend()),
                   config.flagfile_text(), ESSENTIAL, config.outputs.overwrite,
                   trajectory=TRAJECTORY)
    distribution = "DataParallel" if len(devices) > 1 else "OneDevice"
    note = " | batch norm: keras" if config.model.batch_norm != "keras" else ""
    print(program.start_line(config, f"{keras.backend.backend()} {distribution}", len(devices),
                             precision, data) + note, flush=True)
    if config.stage == "pretext":
        return pretext_stage.run(KerasPretext(config, data[0]), *data)
    return probe_stage.run(config, loaded=loaded)


class KerasPretext(pretext_stage.PretextAdapter):
    """The adapter of `program.pretext_stage` on this backend (module docstring): uint8 NumPy
    batches (`data.stream.ImageBatches`, a pure function of (seed, step)), the pairs or
    rotations made on the device inside the jitted step (`models.pretext`), Keras `.weights.h5`
    checkpoints, the CSV (and TensorBoard) summaries, the export through a TensorFlow child
    process."""

    fit_kwargs = {"shuffle": False}  # the batches are already in their order

    def __init__(self, config: RunConfig, images):
        super().__init__(config, images)
        # Reading the skip counter waits for the device: every step only with --on_nonfinite=stop.
        self.skip_check_every = 1 if config.train.on_nonfinite == "stop" else \
            config.outputs.summary_every_steps

    @property
    def files(self) -> bool:
        """The images are a folder's file list (decoded by the reader's threads, which crop and
        flip them by the 224-pixel protocol: the device then does not augment again)."""
        from aetv2_tf.data.image_folders import ImageFiles

        return isinstance(self.images, ImageFiles)

    def batches(self, start: int, stop: int):
        from aetv2_tf.data.stream import FileBatches, ImageBatches

        seed = self.config.train.seed
        if self.files:  # Pillow releases the GIL: threads decode in parallel
            return FileBatches(self.images, self.images_per_step, seed, start, stop,
                               self.size, self.config.data.augment,
                               workers=min(os.cpu_count() or 1, 32))
        return ImageBatches(self.images, self.images_per_step, seed, start, stop)

    def build(self, steps: int):
        return pretext_stage.build_model(self.config, steps, inputs="images", mean=self.mean,
                                   std=self.std,
                                   augment=self.config.data.augment and not self.files)

    def checkpoints(self, model, optimizer):
        from aetv2_tf.program.keras_checkpoints import KerasCheckpoints, restore_checkpoint

        directory = os.path.join(self.config.outputs.model_dir, "checkpoints")
        return KerasCheckpoints(directory, self.config.outputs.keep_checkpoints), \
            restore_checkpoint(model, directory)

    def summaries(self, counter, schedule):
        from aetv2_tf.data.stream import load_crop

        sample = np.stack([load_crop(p, self.size, None) for p in self.images.paths[:4]]) \
            if self.files else self.images[:4]
        return summary_callbacks(self.config, counter, schedule, sample, self.mean, self.std)

    def export(self, encoder, model) -> dict:
        return export_saved_model(self.config.outputs.model_dir)

    def exports(self) -> bool:
        from aetv2_tf.program.flag_support import tensorflow_importable

        return self.config.outputs.export and tensorflow_importable()


def export_saved_model(model_dir: str) -> dict:
    """`--export` here: the SavedModel is TensorFlow's, so `python -m aetv2_tf.export` runs on
    the TensorFlow backend in a child process, from `encoder.weights.h5` (the flag-support
    table refuses an explicit --export where TensorFlow is not importable; by default the
    export is then left out, and the summary says so)."""
    import subprocess
    import sys

    from aetv2_tf.program.flag_support import tensorflow_importable

    if not tensorflow_importable():
        return {"export": "none (TensorFlow is not importable here)"}
    out = os.path.join(model_dir, "export", "encoder")
    # On the CPU: the accelerator's memory is JAX's.
    env = dict(os.environ, KERAS_BACKEND="tensorflow", CUDA_VISIBLE_DEVICES="",
               TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    proc = subprocess.run([sys.executable, "-m", "aetv2_tf.export",
                           f"--model_dir={model_dir}", f"--output={out}"], env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        logging.error("SavedModel export failed (exit %d): %s", proc.returncode,
                      proc.stderr[-2000:])
        return {"export": f"FAILED (exit {proc.returncode}); retry with python -m "
                          f"aetv2_tf.export --model_dir={model_dir}"}
    return {"export": out}


def summary_callbacks(config: RunConfig, counter, schedule, sample, mean,
                      std) -> list[keras.callbacks.Callback]:
    """The logs of `monitoring.PretextSummaries` (interval means, learning rate, pairs/s): rows of
    train/log.csv always (its columns: the scalars of the first row, `scalar_logs.CsvLog`); where
    TensorFlow is importable also TensorBoard, its scalars and (AET) the image pairs of the 4
    training images `sample` every `--image_summary_every_steps` (kept on the CPU: it must not
    take the accelerator's memory), normalised with `mean`, `std`."""
    from aetv2_tf.files.scalar_logs import CsvLog
    from aetv2_tf.program.monitoring import PretextSummaries

    outputs, batch = config.outputs, config.train.batch_size
    log_dir = os.path.join(outputs.model_dir, "train")
    lr_fn = lambda step: float(keras.ops.convert_to_numpy(schedule(step)))  # noqa: E731
    args = (log_dir, counter, lr_fn, outputs.summary_every_steps, 0, batch)

    class Csv(PretextSummaries):
        def _create_writer(self, directory):
            return os.path.join(directory, "log.csv")  # its columns: the first row's

        def _write_scalars(self, step, row):
            if isinstance(self.writer, str):
                self.writer = CsvLog(self.writer, tuple(row))
            self.writer.write(step, row)

        def on_train_end(self, logs=None):
            pass  # rows are written as they come

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
    if config.pretext == "rotation":
        return out + [PretextSummaries(*args)]
    from aetv2_tf.data.preprocessing_layers import HomographyPairs
    from aetv2_tf.program.pair_pictures import draw_pairs

    x, tx, params = HomographyPairs(seed=config.train.seed + 1, shift=config.data.shift,
                                    augment=False, mean=mean, std=std)(sample)
    sample = (np.asarray(x), np.asarray(tx)), np.asarray(params)
    return out + [Pairs(*args[:4],
                        outputs.image_summary_every_steps or 10 * outputs.summary_every_steps,
                        batch, sample,
                        lambda x, tx, p, q: draw_pairs(x, tx, p, q, mean, std))]
