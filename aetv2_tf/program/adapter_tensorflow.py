"""The TensorFlow adapter of the program: `TensorFlowPretext` (tf.distribute, tf.data, Keras
checkpoints, TensorBoard, the SavedModel export) and `run`, the TensorFlow program's set-up
(devices, strategy, precision, model_dir) before the chosen stage. `aetv2_tf.train.main` runs it
when Keras's backend is TensorFlow; its sibling `adapter_portable` serves the other backends."""

from __future__ import annotations

import contextlib
import os
import re
import shutil

import keras
import tensorflow as tf
from absl import logging

from aetv2_tf.errors import UsageError
from aetv2_tf.program import common as program
from aetv2_tf.program import config as run_config
from aetv2_tf.program import pretext_stage, rundir
from aetv2_tf.program.config import RunConfig
from aetv2_tf.program.flags import ESSENTIAL, TRAJECTORY
from aetv2_tf.program.precision import choose_precision, onednn_state

#: A collective that lost a peer: dead worker (unavailable) or `--collective_timeout_seconds`.
PEER_LOST = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)


def check_machine(config: RunConfig, num_replicas: int) -> None:
    """`config.check_machine` for TensorFlow, and a `--data_service` that answers."""
    run_config.check_machine(config, num_replicas, "tensorflow",
                             accelerator=bool(tf.config.list_logical_devices("GPU")))
    if config.data.data_service:
        check_data_service(config.data.data_service, config.stage)


def check_data_service(address: str, stage: str, timeout: float = 10.0) -> None:
    """A `--data_service` dispatcher must answer before the run starts: tf.data's client would
    otherwise wait for it without a word."""
    import socket

    match = re.fullmatch(r"(grpc://)?([^:/]+):(\d+)", address)
    if match is None:
        raise UsageError(f"--data_service={address}: expected grpc://<host>:<port> of a tf.data "
                         "service dispatcher (BUILD.md, 'Feeding an accelerator ImageNet').")
    if stage != "pretext":
        raise UsageError("--data_service serves the pretext stage's pipeline; drop it for "
                         f"--stage={stage}.")
    try:
        socket.create_connection((match[2], int(match[3])), timeout=timeout).close()
    except OSError as e:
        raise UsageError(f"--data_service={address}: no dispatcher answers ({e}); start one "
                         "(BUILD.md, 'Feeding an accelerator ImageNet') or drop the flag.") from e


def restore(checkpoint: tf.train.Checkpoint, directory: str) -> int:
    """Restores the newest `tf.train.Checkpoint` in `directory` (the format of runs written
    before the Keras `.weights.h5` checkpoints; they resume, then save in the new format);
    returns its step (batches consumed), 0 when there is none. Only a checkpoint listed in
    `directory/checkpoint` is read: a save cut short by a crash is never loaded."""
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


class TensorFlowPretext(pretext_stage.PretextAdapter):
    """The TensorFlow adapter of `aetv2_tf.program.pretext_stage` (its `PretextAdapter`): the pairs
    (or rotations) made by the tf.data pipelines, the model built in the tf.distribute `strategy`'s
    scope with `--batch_norm`, Keras `.weights.h5` checkpoints as on every backend
    (`keras_checkpoints.KerasCheckpoints`; every worker saves, as reading distributed variables
    may need collectives, but only the chief into the model_dir; every worker resumes from the
    chief's checkpoints: a shared filesystem, BUILD.md), TensorBoard summaries with the image
    pairs (chief), the SavedModel export."""

    def __init__(self, config: RunConfig, strategy: tf.distribute.Strategy, chief: bool,
                 images):
        from aetv2_tf.data import pipelines
        from aetv2_tf.program import distribute

        super().__init__(config, images)
        self.strategy, self.chief = strategy, chief
        self.make_data = pipelines.rotation_dataset if self.rotation else \
            pipelines.pretext_dataset
        self.worker_tmp = os.path.join(config.outputs.model_dir, ".worker_tmp",
                                       distribute.task_name(strategy))
        # The AET pair's warp: on the GPU when one is there (--warp; the same pairs).
        gpu = bool(tf.config.list_logical_devices("GPU"))
        warp = config.data.warp
        self.warp_on_device = not self.rotation and (warp == "device" or (warp == "auto" and gpu))
        self.other_writers = distribute.num_workers(strategy) - 1

    def dataset_from(self, step: int, batch_size: int | None = None, **kwargs):
        data = self.config.data
        options = {"augment": data.augment} if self.rotation else \
            {"shift": data.shift, "augment": data.augment, "warp_on_device": self.warp_on_device}
        from aetv2_tf.data.pipelines import from_data_service

        ds = self.make_data(self.images, batch_size or self.config.train.batch_size,
                            image_size=self.size, mean=self.mean, std=self.std,
                            **{"seed": self.config.train.seed, "start_step": step, **options,
                               **kwargs})
        return from_data_service(ds, data.data_service) if data.data_service else ds

    def batches(self, start: int, stop: int):
        """Steps `start .. stop - 1`. A file list on several replicas goes through
        `distribute_datasets_from_function`: each worker decodes only its rows of every global
        batch (`pipelines.pretext_dataset`'s `shard`), split into its replicas' batches; other
        sources are split by Keras (`experimental_distribute_dataset`: every worker computes
        the whole batch and keeps its part, which is cheap for CIFAR-10 arrays)."""
        from aetv2_tf.data.image_folders import ImageFiles

        if not isinstance(self.images, ImageFiles) or self.strategy.num_replicas_in_sync == 1:
            return self.dataset_from(start).take(stop - start)

        def per_worker(context: tf.distribute.InputContext) -> tf.data.Dataset:
            shard = (context.input_pipeline_id, context.num_input_pipelines)
            local = context.num_replicas_in_sync // context.num_input_pipelines
            per_replica = context.get_per_replica_batch_size(self.config.train.batch_size)
            return self.dataset_from(start, shard=shard).rebatch(
                per_replica, drop_remainder=True).take(
                (stop - start) * local)

        return self.strategy.distribute_datasets_from_function(per_worker)

    def build(self, steps: int):
        from aetv2_tf.program import distribute

        # The fused warp op has no XLA kernel: a TPU compiles the keras.ops warp.
        tpu = isinstance(self.strategy, tf.distribute.TPUStrategy)
        built = pretext_stage.build_model(
            self.config, steps, inputs="warp" if self.warp_on_device else "pairs",
            mean=self.mean, std=self.std, augment=self.config.data.augment,
            scope=self.strategy.scope(), fused_warp=False if tpu else None, jit_compile=False)
        distribute.patch_keras_multi_worker_fit(built[1], self.strategy)
        return built

    def checkpoints(self, model, optimizer):
        from aetv2_tf.program.keras_checkpoints import KerasCheckpoints, restore_checkpoint

        outputs = self.config.outputs
        ckpt_dir = os.path.join(outputs.model_dir, "checkpoints")
        start = restore_checkpoint(model, ckpt_dir, writer=self.chief)
        if not start and tf.train.latest_checkpoint(ckpt_dir):  # a run of an earlier version
            with self.strategy.scope():
                start = restore(tf.train.Checkpoint(model=model, optimizer=optimizer), ckpt_dir)
        # The other workers' checkpoints are throwaway copies (the chief's are read): keep one.
        store = KerasCheckpoints(ckpt_dir if self.chief else self.worker_tmp,
                                 outputs.keep_checkpoints if self.chief else 1)
        return store, start

    def signal_agreement(self):
        from aetv2_tf.program import distribute

        return distribute.signal_agreement(self.strategy)

    def summaries(self, counter, schedule):
        from aetv2_tf.program.monitoring import PretextSummaries
        from aetv2_tf.program.pair_pictures import draw_pairs

        outputs = self.config.outputs
        if not self.chief:
            return []
        sample = None
        if not self.rotation:  # four pairs to draw (and the model's inputs for them)
            def first(**kwargs):
                seed = self.config.train.seed + 1
                return next(iter(self.dataset_from(0, batch_size=4, seed=seed, augment=False,
                                                   **kwargs)))

            sample = first(warp_on_device=False)
            if self.warp_on_device:
                sample = (*sample, first()[0])
        mean, std = self.mean, self.std
        return [PretextSummaries(
            os.path.join(outputs.model_dir, "train"), counter, lambda s: schedule(s).numpy(),
            outputs.summary_every_steps,
            outputs.image_summary_every_steps or 10 * outputs.summary_every_steps,
            self.config.train.batch_size, sample,
            lambda x, tx, p, q: draw_pairs(x.numpy(), tx.numpy(), p, q, mean, std))]

    def export(self, encoder, model) -> dict:
        from aetv2_tf.files.savedmodel import export_encoder
        from aetv2_tf.program.keras_checkpoints import save_atomically

        model_dir = self.config.outputs.model_dir
        save_atomically(model.save, os.path.join(model_dir, "aet_model.keras"))
        out = os.path.join(model_dir, "export", "encoder")
        export_encoder(encoder, out, self.config.data.dataset)
        return {"export": out}

    def close(self) -> None:
        if not self.chief:
            shutil.rmtree(self.worker_tmp, ignore_errors=True)
            with contextlib.suppress(OSError):  # the last worker out removes the empty parent
                os.rmdir(os.path.dirname(self.worker_tmp))


def run(config: RunConfig) -> dict:
    """Sets up devices, precision and the model_dir, then runs the chosen stage."""
    from aetv2_tf.program import distribute

    machine = config.machine
    distribute.configure_cpu_devices(machine.cpu_devices)
    if machine.deterministic:
        tf.config.experimental.enable_op_determinism()
    try:  # before any op or variable: multi-worker strategies need a fresh TensorFlow context
        strategy = distribute.get_strategy(machine.strategy, machine.tpu,
                                           machine.collective_timeout_seconds)
    except ValueError as e:
        raise UsageError(str(e)) from e
    keras.utils.set_random_seed(config.train.seed)
    check_machine(config, strategy.num_replicas_in_sync)
    chief = distribute.is_chief(strategy)
    accelerator = "tpu" if tf.config.list_logical_devices("TPU") else \
        "gpu" if tf.config.list_logical_devices("GPU") else ""
    precision = choose_precision(machine.mixed_precision, "tensorflow", accelerator)
    keras.mixed_precision.set_global_policy(precision.policy)
    # Bad data fails here, before the model_dir is touched.
    data = program.load_train_images(config) if config.stage == "pretext" else None
    if data is not None:
        pretext_stage.check_batch_fits(config, data[2], accelerator=bool(accelerator))
    from aetv2_tf.program import probe_stage
    # A probe reads its data and --pretrained encoder here too: a failure writes nothing.
    loaded = probe_stage.load(config) if config.stage != "pretext" else None
    rundir.prepare(config.outputs.model_dir, config.recorded(precision._asdict()),
                   config.flagfile_text(), ESSENTIAL, config.outputs.overwrite, chief, TRAJECTORY)
    kernels = "" if accelerator else f"oneDNN {onednn_state()}"
    print(program.start_line(config, type(strategy).__name__.lstrip("_"),
                             strategy.num_replicas_in_sync, precision, data, kernels), flush=True)
    if config.stage == "pretext":
        return pretext_stage.run(TensorFlowPretext(config, strategy, chief, data[0]), *data)
    return probe_stage.run(config, strategy, chief, loaded)
