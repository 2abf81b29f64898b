"""The pretext stage (AET or RotNet pretraining) of every Keras backend: one training loop.

    --train_seconds budget -> steps -> model -> resume -> fit to the stop -> summary ->
    (finished) encoder.weights.h5, --export, quick KNN

What a backend does its own way is a `PretextAdapter`: how the model is built (strategy scope,
batch norm, where the pairs are made), the batches of steps ``start .. stop - 1``, the checkpoint
store it resumes from, the summaries and the export. TensorFlow's is
`adapter_tensorflow.TensorFlowPretext` (tf.data pairs, tf.distribute), the others' is
`adapter_portable.KerasPretext` (NumPy batches, pairs on the device). Both save Keras
``.weights.h5`` checkpoints (`keras_checkpoints.KerasCheckpoints`).
Everything else is here once: the step counter (batches consumed: the data position and the
checkpoint name), the exact stop, the signal, non-finite and checkpoint callbacks, the summary
and what a finished run writes.
"""

from __future__ import annotations

import os
from typing import Any

import keras

from aetv2_tf.data.constants import normalization_constants
from aetv2_tf.program import common as program
from aetv2_tf.program.callbacks import (
    CheckpointEvery,
    CheckpointStore,
    StepCounter,
    StopOnSignal,
    StopOnSkippedStep,
)
from aetv2_tf.program.flags import FLAGS
from aetv2_tf.program.keras_checkpoints import discard_encoder_weights, save_encoder_weights
from aetv2_tf.program.loss_growth import StopOnLossGrowth


class PretextAdapter:
    """A backend's part of the pretext stage (module docstring). `chief`: this worker writes the
    model_dir; `images_per_step`: training images a step consumes (RotNet: a quarter of the
    batch, shown in 4 rotations); `fit_kwargs`: extra `model.fit` arguments;
    `skip_check_every`: how often the non-finite step counter is read (reading it waits for
    the device)."""

    chief: bool = True
    other_writers: int = 0  # workers that write throwaway checkpoints beside the chief's
    fit_kwargs: dict[str, Any] = {}
    skip_check_every: int = 1

    def __init__(self, images):
        """What both backends derive from the flags alike: `size` (the backbone's input side),
        `rotation` (RotNet), `images_per_step`, and `mean`, `std`:
        the dataset's normalisation (`normalization_constants`, the one rule that the probes
        and the export follow too)."""
        F = FLAGS
        self.images = images
        self.size = program.IMAGE_SIZE[F.backbone]
        self.rotation = F.pretext == "rotation"
        self.images_per_step = F.batch_size // 4 if self.rotation else F.batch_size
        self.mean, self.std = normalization_constants(F.dataset)

    def build(self, steps: int) -> tuple[keras.Model, keras.Model, Any, Any]:
        """`(encoder, compiled pretext model, schedule, optimizer)` of a `steps`-step run, the
        same initial weights every call (seeded)."""
        raise NotImplementedError

    def batches(self, start: int, stop: int) -> Any:
        """The training batches of steps `start .. stop - 1` (what `fit` takes), ending there."""
        raise NotImplementedError

    def checkpoints(self, model: keras.Model, optimizer) -> tuple[CheckpointStore, int]:
        """The store checkpoints go to, and the step restored from its newest one (0: none)."""
        raise NotImplementedError

    def summaries(self, counter: StepCounter, schedule) -> list[keras.callbacks.Callback]:
        """The logging callbacks (`callbacks.PretextSummaries` and friends)."""
        raise NotImplementedError

    def export(self, encoder: keras.Model, model: keras.Model) -> dict:
        """`--export` of a finished run; returns summary entries."""
        raise NotImplementedError

    def signal_agreement(self):
        """How the workers agree to stop on a signal (`callbacks.StopOnSignal`'s `agree`); None:
        one process."""
        return None

    def close(self) -> None:
        """Called once at the end (e.g. a non-chief worker's scratch directory)."""


def check_batch_fits(num_examples: int | None, accelerator: bool = False) -> None:
    """A step takes `--batch_size` distinct images (RotNet: a quarter, in 4 rotations): fewer
    training images than that, or a step whose memory exceeds the machine's on the CPU (not
    `accelerator`: `step_memory.check_step_memory`), is refused before the model_dir is
    written (UsageError)."""
    from aetv2_tf.errors import UsageError
    from aetv2_tf.program.step_memory import check_step_memory

    F = FLAGS
    per_step = F.batch_size // 4 if F.pretext == "rotation" else F.batch_size
    if num_examples is not None and num_examples < per_step:
        images = "a quarter of --batch_size (RotNet shows each in 4 rotations)" \
            if F.pretext == "rotation" else "--batch_size"
        raise UsageError(f"--batch_size={F.batch_size}: a step takes {per_step} training images "
                         f"({images}), but the data has only {num_examples} (--train_examples="
                         f"{F.train_examples}); lower --batch_size or raise --train_examples.")
    check_step_memory(F.backbone, F.batch_size, F.pretext == "rotation", accelerator)


def check_disk(model: keras.Model, encoder: keras.Model, other_writers: int = 0) -> None:
    """Fails before the first step, not at the first checkpoint hours later, when the model_dir's
    disk cannot hold what this model's run writes (`disk_bytes_needed`), counting the checkpoints
    already there as space (they are rotated out); `other_writers` workers beside the chief
    each keep one throwaway checkpoint under `<model_dir>/.worker_tmp` (a shared disk)."""
    from aetv2_tf.program import rundir
    from aetv2_tf.program.keras_checkpoints import disk_bytes_needed, list_checkpoints

    F = FLAGS
    needed = disk_bytes_needed(model, encoder, F.keep_checkpoints, F.export, other_writers)
    present = sum(os.path.getsize(path) for _, path in
                  list_checkpoints(os.path.join(F.model_dir, "checkpoints")))
    rundir.check_free_space(F.model_dir, needed - present,
                            f"{F.keep_checkpoints} + 1 checkpoints of this model"
                            f"{', the final encoder and the export' if F.export else ''}")


def export(adapter: PretextAdapter, encoder: keras.Model, model: keras.Model) -> dict:
    """`adapter.export`, its failure turned into summary entries (`export_failed`: the program
    exits 4): the training is done and its encoder written, so only the export is to redo."""
    try:
        out = adapter.export(encoder, model)
    except Exception as e:  # noqa: BLE001 - any failure of the export, reported, not raised
        from absl import logging

        logging.error("SavedModel export failed: %s: %s", type(e).__name__, e)
        out = {"export": f"FAILED ({type(e).__name__})"}
    if str(out.get("export", "")).startswith("FAILED"):
        out["export_failed"] = True
    return out


def run(adapter: PretextAdapter, images, labels, num_examples: int | None) -> dict:
    """Trains the pretext model of the flags with `adapter`; returns the summary `train.main`
    prints (`program.fit_and_summarize`, plus what a finished run wrote)."""
    F = FLAGS

    def fit_first_steps(n: int, timer: keras.callbacks.Callback) -> None:
        adapter.build(n)[1].fit(adapter.batches(0, n), epochs=1, steps_per_epoch=n,
                                callbacks=[timer], verbose=0, **adapter.fit_kwargs)

    budget = program.budget_steps(fit_first_steps, writer=adapter.chief) \
        if F.train_seconds else 0
    per_epoch, steps = program.total_steps(num_examples, adapter.images_per_step, budget)
    encoder, model, schedule, optimizer = adapter.build(steps)
    store, start = adapter.checkpoints(model, optimizer)
    stop = program.stop_step(start, steps)
    if adapter.chief and start < stop:
        check_disk(model, encoder, adapter.other_writers)
    counter = StepCounter(start, stop)
    saver = CheckpointEvery(store, counter, F.checkpoint_every_steps, writer=adapter.chief)
    callbacks = [counter,
                 StopOnSkippedStep(optimizer, counter, F.on_nonfinite == "stop",
                                   every=adapter.skip_check_every),
                 program.StopAtStep(stop, counter),
                 *([program.StopAtDeadline(end)] if (end := program.deadline()) else []),
                 # before the saver: no checkpoint of the weights whose loss grew
                 StopOnLossGrowth(saver, counter, F.max_loss_growth),
                 saver,
                 # after CheckpointEvery: its handlers outlive the final save
                 StopOnSignal(adapter.signal_agreement()),
                 *adapter.summaries(counter, schedule)]
    if adapter.chief and start < stop:
        discard_encoder_weights(F.model_dir)  # it would describe an older end of the run
    summary, finished = program.fit_and_summarize(
        model, adapter.batches(start, stop), start, stop, steps, per_epoch, callbacks,
        **adapter.fit_kwargs)
    if adapter.chief and finished:
        summary["encoder_weights"] = save_encoder_weights(encoder, F.backbone, F.model_dir)
        if F.export:
            summary.update(export(adapter, encoder, model))
        if F.quick_knn_train:
            summary.update(program.quick_knn_summary(encoder, images, labels))
    adapter.close()
    return summary
