"""`KerasNativeBackend`: the program's part on JAX and any other Keras backend but TensorFlow
(`backend.Backend`), same command and flags; TensorFlow is never needed (imported only where it
is there, for TensorBoard and the SavedModel export). Which flag values run here:
`aetv2_tf.program.flag_support`.

    KERAS_BACKEND=jax python -m aetv2_tf.train --flagfile=configs/cifar10_aetv2.cfg
"""

from __future__ import annotations

import os

import keras
import numpy as np
from absl import logging

from aetv2_tf.errors import UsageError
from aetv2_tf.program import config as run_config
from aetv2_tf.program import flag_support, pretext_stage
from aetv2_tf.program.backend import Backend
from aetv2_tf.program.config import RunConfig
from aetv2_tf.program.keras_checkpoints import KerasCheckpoints, restore_checkpoint
from aetv2_tf.program.pretext_data import PretextData


class KerasNativeBackend(Backend):
    """Every local device through `keras.distribution.DataParallel`; uint8 NumPy batches (a pure
    function of (seed, step)), the pairs or rotations made on the device inside the jitted step
    (`models.pretext`); `.weights.h5` checkpoints; CSV (and TensorBoard) summaries; the export
    in a TensorFlow child process. BatchNorm is always Keras's (the start line says so)."""

    fit_kwargs = {"shuffle": False}  # the batches are already in their order

    def __init__(self, config: RunConfig):
        super().__init__(config)
        flag_support.tensorflow_importable()  # Keras seeds TensorFlow where it is: import quietly
        self.name = keras.backend.backend()
        self.devices = keras.distribution.list_devices()
        self.replicas = len(self.devices)
        self.accelerator = _accelerator()
        self.distribution = f"{self.name} {'DataParallel' if self.replicas > 1 else 'OneDevice'}"
        self.note = " | batch norm: keras" if config.model.batch_norm != "keras" else ""

    def prepare_devices(self) -> None:
        """`config.check_machine` for this backend (its flag-support table), RotNet's batch
        against the devices, then `keras.distribution.DataParallel` over several."""
        config, devices = self.config, self.replicas
        run_config.check_machine(config, devices, self.name, accelerator=self.accelerator != "")
        batch = config.train.batch_size
        if config.stage == "pretext" and config.pretext == "rotation" and batch % (4 * devices):
            raise UsageError(f"--pretext=rotation feeds --batch_size/4 images a step, split over "
                             f"the {devices} devices: --batch_size={batch} must be a "
                             f"multiple of {4 * devices}.")
        if devices > 1:
            keras.distribution.set_distribution(
                keras.distribution.DataParallel(devices=self.devices))

    def skip_check_every(self) -> int:
        """Every step with --on_nonfinite=stop, else at every summary."""
        return 1 if self.config.train.on_nonfinite == "stop" else \
            self.config.outputs.summary_every_steps

    def batches(self, data: PretextData, start: int, stop: int):
        """A folder's file list is decoded by the reader's threads (Pillow releases the GIL),
        which crop and flip by the 224-pixel protocol; arrays go as they are."""
        from aetv2_tf.data.stream import FileBatches, ImageBatches

        seed = self.config.train.seed
        if _files(data):
            return FileBatches(data.images, data.images_per_step, seed, start, stop, data.side,
                               self.config.data.augment, workers=min(os.cpu_count() or 1, 32))
        return ImageBatches(data.images, data.images_per_step, seed, start, stop)

    def build(self, data: PretextData, steps: int):
        """The pairs made inside the step; the device does not augment a folder's images again
        (the reader's threads did)."""
        return pretext_stage.build_model(self.config, steps, inputs="images", mean=data.mean,
                                         std=data.std,
                                         augment=self.config.data.augment and not _files(data))

    def checkpoints(self, model, optimizer):
        directory = os.path.join(self.config.outputs.model_dir, "checkpoints")
        return KerasCheckpoints(directory, self.config.outputs.keep_checkpoints), \
            restore_checkpoint(model, directory)

    def summaries(self, data: PretextData, step_fn, schedule):
        from aetv2_tf.data.stream import load_crop

        sample = np.stack([load_crop(p, data.side, None) for p in data.images.paths[:4]]) \
            if _files(data) else data.images[:4]
        return summary_callbacks(self.config, step_fn, schedule, sample, data.mean, data.std)

    def export(self, encoder, model) -> dict:
        return export_saved_model(self.config.outputs.model_dir)

    def exports(self) -> bool:
        return self.config.outputs.export and flag_support.tensorflow_importable()


def _files(data: PretextData) -> bool:
    """Whether the images are a folder's file list (`ImageFiles`)."""
    from aetv2_tf.data.image_folders import ImageFiles

    return isinstance(data.images, ImageFiles)


def _accelerator() -> str:
    """"tpu", "gpu" (CUDA, ROCm) or "" (a CPU): the local devices' platform."""
    platforms = {d.split(":")[0].lower() for d in keras.distribution.list_devices()}
    return "tpu" if "tpu" in platforms else "gpu" if platforms & {"gpu", "cuda", "rocm"} else ""


def export_saved_model(model_dir: str) -> dict:
    """`--export`: `python -m aetv2_tf.export` on the TensorFlow backend in a child process, from
    `encoder.weights.h5`; left out (the summary says so) where TensorFlow is not importable."""
    import subprocess
    import sys

    if not flag_support.tensorflow_importable():
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


def decoder_prediction(model: keras.Model, inputs) -> np.ndarray:
    """The decoded parameters (B, 8) of the uint8 image pairs ``inputs``: the pairs model's
    inner AET model (`monitoring.PretextSummaries`'s ``predict``)."""
    aet = model.get_layer("aet")
    return keras.ops.convert_to_numpy(aet(list(inputs), training=False)).astype(np.float32)


def summary_callbacks(config: RunConfig, step_fn, schedule, sample, mean,
                      std) -> list[keras.callbacks.Callback]:
    """`monitoring.PretextSummaries` into train/log.csv, and where TensorFlow is importable
    (kept on the CPU) TensorBoard with (AET) the pairs of the 4 training images `sample`,
    normalised with `mean`, `std`."""
    from aetv2_tf.program.monitoring import CsvScalars, PretextSummaries, TensorBoardLog

    outputs, batch = config.outputs, config.train.batch_size
    log_dir = os.path.join(outputs.model_dir, "train")
    lr_fn = lambda step: float(keras.ops.convert_to_numpy(schedule(step)))  # noqa: E731
    logs = [CsvScalars(os.path.join(log_dir, "log.csv"))]
    args = (step_fn, lr_fn, outputs.summary_every_steps)
    try:
        if not flag_support.tensorflow_importable():  # (imported there, quietly)
            raise ImportError("TensorFlow is not importable")
        import tensorflow as tf

        tf.config.set_visible_devices([], "GPU")
        logs.append(TensorBoardLog(log_dir))
    except Exception as e:  # noqa: BLE001 - absent, blocked or unusable: the CSV is enough
        logging.info("No TensorBoard summaries (%s); train/log.csv has the scalars.", e)
    if len(logs) == 1 or config.pretext == "rotation":  # no TensorBoard, or no pairs to draw
        return [PretextSummaries(logs, *args, 0, batch)]
    from aetv2_tf.data.preprocessing_layers import HomographyPairs
    from aetv2_tf.program.pair_pictures import draw_pairs

    x, tx, params = HomographyPairs(seed=config.train.seed + 1, shift=config.data.shift,
                                    augment=False, mean=mean, std=std)(sample)
    pairs = (np.asarray(x), np.asarray(tx)), np.asarray(params)
    return [PretextSummaries(
        logs, *args, outputs.image_summary_every_steps or 10 * outputs.summary_every_steps,
        batch, pairs, lambda x, tx, p, q: draw_pairs(x, tx, p, q, mean, std),
        decoder_prediction)]
