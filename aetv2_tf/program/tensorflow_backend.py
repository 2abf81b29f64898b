"""`TensorFlowBackend`: the program's part on TensorFlow (`backend.Backend`)."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil

import tensorflow as tf

from aetv2_tf.errors import UsageError
from aetv2_tf.program import config as run_config
from aetv2_tf.program import distribute, pretext_stage
from aetv2_tf.program.backend import Backend
from aetv2_tf.program.config import RunConfig
from aetv2_tf.program.keras_checkpoints import KerasCheckpoints, restore_checkpoint, save_atomically
from aetv2_tf.program.precision import onednn_state
from aetv2_tf.program.pretext_data import PretextData

#: A collective that lost a peer: dead worker (unavailable) or `--collective_timeout_seconds`.
PEER_LOST = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)


def check_data_service(address: str, stage: str, timeout: float = 10.0) -> None:
    """UsageError unless the `--data_service` dispatcher answers (tf.data's client would wait
    for it without a word)."""
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


class TensorFlowBackend(Backend):
    """The ``--strategy`` of tf.distribute, the tf.data pipelines' pairs (or rotations), the
    model in the strategy's scope, `.weights.h5` checkpoints (every worker saves, as reading
    distributed variables may need collectives, but only the chief into the model_dir; all
    resume from the chief's: a shared filesystem), TensorBoard summaries, the SavedModel."""

    name = "tensorflow"
    peer_lost = PEER_LOST

    def __init__(self, config: RunConfig):
        super().__init__(config)
        machine = config.machine
        distribute.configure_cpu_devices(machine.cpu_devices)
        if machine.deterministic:
            tf.config.experimental.enable_op_determinism()
        try:  # before any op or variable: multi-worker strategies need a fresh context
            self.strategy = distribute.get_strategy(machine.strategy, machine.tpu,
                                                    machine.collective_timeout_seconds)
        except ValueError as e:
            raise UsageError(str(e)) from e
        self.replicas = self.strategy.num_replicas_in_sync
        self.chief = distribute.is_chief(self.strategy)
        self.other_writers = distribute.num_workers(self.strategy) - 1
        self.worker_tmp = os.path.join(config.outputs.model_dir, ".worker_tmp",
                                       distribute.task_name(self.strategy))
        self.accelerator = "tpu" if tf.config.list_logical_devices("TPU") else \
            "gpu" if tf.config.list_logical_devices("GPU") else ""
        self.distribution = type(self.strategy).__name__.lstrip("_")
        self.kernels = "" if self.accelerator else f"oneDNN {onednn_state()}"
        # The AET pair's warp: on the GPU when one is there (--warp; the same pairs).
        warp = config.data.warp
        self.warp_on_device = config.pretext != "rotation" and (
            warp == "device" or (warp == "auto" and bool(tf.config.list_logical_devices("GPU"))))

    def prepare_devices(self) -> None:
        """`config.check_machine` for TensorFlow, and a `--data_service` that answers."""
        config = self.config
        run_config.check_machine(config, self.replicas, "tensorflow",
                                 accelerator=bool(tf.config.list_logical_devices("GPU")))
        if config.data.data_service:
            check_data_service(config.data.data_service, config.stage)

    def recorded_backend(self) -> None:
        return None  # TensorFlow's program: a run without a recorded backend

    def dataset_from(self, data: PretextData, step: int, batch_size: int | None = None,
                     **kwargs) -> tf.data.Dataset:
        """The pipeline's batches from step ``step`` on (``kwargs`` override its options),
        through the ``--data_service`` where given."""
        from aetv2_tf.data.pipelines import from_data_service, pretext_dataset, rotation_dataset

        options = self.config.data
        make = rotation_dataset if data.rotation else pretext_dataset
        settings = {"augment": options.augment} if data.rotation else \
            {"shift": options.shift, "augment": options.augment,
             "warp_on_device": self.warp_on_device}
        ds = make(data.images, batch_size or self.config.train.batch_size, image_size=data.side,
                  mean=data.mean, std=data.std,
                  **{"seed": self.config.train.seed, "start_step": step, **settings, **kwargs})
        return from_data_service(ds, options.data_service) if options.data_service else ds

    def batches(self, data: PretextData, start: int, stop: int):
        """Steps `start .. stop - 1`: a file list on several replicas is sharded (each worker
        decodes only its rows of every global batch); other sources are split by Keras."""
        from aetv2_tf.data.image_folders import ImageFiles

        if not isinstance(data.images, ImageFiles) or self.replicas == 1:
            return self.dataset_from(data, start).take(stop - start)
        return self.strategy.distribute_datasets_from_function(
            functools.partial(self._worker_batches, data, start, stop))

    def _worker_batches(self, data: PretextData, start: int, stop: int,
                        context: tf.distribute.InputContext) -> tf.data.Dataset:
        """This worker's shard of steps ``start .. stop - 1``, in per-replica batches."""
        shard = (context.input_pipeline_id, context.num_input_pipelines)
        local = context.num_replicas_in_sync // context.num_input_pipelines
        per_replica = context.get_per_replica_batch_size(self.config.train.batch_size)
        return self.dataset_from(data, start, shard=shard).rebatch(
            per_replica, drop_remainder=True).take((stop - start) * local)

    def build(self, data: PretextData, steps: int):
        # The fused warp op has no XLA kernel: a TPU compiles the keras.ops warp.
        tpu = isinstance(self.strategy, tf.distribute.TPUStrategy)
        built = pretext_stage.build_model(
            self.config, steps, inputs="warp" if self.warp_on_device else "pairs",
            mean=data.mean, std=data.std, augment=self.config.data.augment,
            scope=self.strategy.scope(), fused_warp=False if tpu else None, jit_compile=False)
        distribute.patch_keras_multi_worker_fit(built[1], self.strategy)
        return built

    def checkpoints(self, model, optimizer):
        outputs = self.config.outputs
        ckpt_dir = os.path.join(outputs.model_dir, "checkpoints")
        start = restore_checkpoint(model, ckpt_dir, writer=self.chief)
        # The other workers' checkpoints are throwaway copies (the chief's are read): keep one.
        store = KerasCheckpoints(ckpt_dir if self.chief else self.worker_tmp,
                                 outputs.keep_checkpoints if self.chief else 1)
        return store, start

    def signal_agreement(self):
        return distribute.signal_agreement(self.strategy)

    def summaries(self, data: PretextData, step_fn, schedule):
        from aetv2_tf.program.monitoring import PretextSummaries, TensorBoardLog
        from aetv2_tf.program.pair_pictures import draw_pairs

        outputs = self.config.outputs
        if not self.chief:
            return []
        sample = None
        if not data.rotation:  # four pairs to draw (and the model's inputs for them)
            sample = self._first_pairs(data, warp_on_device=False)
            if self.warp_on_device:
                sample = (*sample, self._first_pairs(data)[0])
        mean, std = data.mean, data.std
        return [PretextSummaries(
            [TensorBoardLog(os.path.join(outputs.model_dir, "train"))], step_fn,
            lambda s: schedule(s).numpy(), outputs.summary_every_steps,
            outputs.image_summary_every_steps or 10 * outputs.summary_every_steps,
            self.config.train.batch_size, sample,
            lambda x, tx, p, q: draw_pairs(x.numpy(), tx.numpy(), p, q, mean, std))]

    def _first_pairs(self, data: PretextData, **kwargs):
        """The first batch of 4 pairs of the pipeline (fewer where the data has fewer images),
        unaugmented, seeded apart from the training's."""
        return next(iter(self.dataset_from(data, 0, batch_size=min(4, data.num_examples or 4),
                                           seed=self.config.train.seed + 1, augment=False,
                                           **kwargs)))

    def export(self, encoder, model) -> dict:
        from aetv2_tf.files.savedmodel import export_encoder
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
