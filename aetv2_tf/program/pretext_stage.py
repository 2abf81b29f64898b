"""The pretext stage (AET or RotNet pretraining) of every Keras backend: one training loop.

    --train_seconds budget -> steps -> model -> resume -> fit to the stop -> summary ->
    (finished) encoder.weights.h5, --export, quick KNN

What a backend does its own way is a `PretextAdapter`: where the pairs are made (its
``inputs`` of `build_model`), the distribution scope, the batches of steps ``start .. stop - 1``,
the checkpoint store it resumes from, the summaries and the export. TensorFlow's is
`adapter_tensorflow.TensorFlowPretext` (tf.data pairs, tf.distribute), the others' is
`adapter_portable.KerasPretext` (NumPy batches, pairs on the device). Both build their model
through `build_model` (the recipe's `build_model` and the model's own ``compile``: the one
assembly path of the library) and save Keras ``.weights.h5`` checkpoints. Everything else is
here once: the step counter (batches consumed: the data position and the checkpoint name), the
exact stop, the signal, non-finite, loss-growth and checkpoint callbacks, the summary and what
a finished run writes.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any

import keras

from aetv2_tf.data.constants import normalization_constants
from aetv2_tf.program import common as program
from aetv2_tf.program import run_length
from aetv2_tf.program.callbacks import (
    CheckpointEvery,
    CheckpointStore,
    StepCounter,
    StopAtDeadline,
    StopAtStep,
    StopOnSignal,
    StopOnSkippedStep,
)
from aetv2_tf.program.config import RunConfig
from aetv2_tf.program.keras_checkpoints import discard_encoder_weights, save_encoder_weights
from aetv2_tf.program.loss_growth import StopOnLossGrowth


class PretextAdapter:
    """A backend's part of the pretext stage (module docstring). ``chief``: this worker writes
    the model_dir; ``images_per_step``: training images a step consumes (RotNet: a quarter of
    the batch, shown in 4 rotations); ``fit_kwargs``: extra ``model.fit`` arguments;
    ``skip_check_every``: how often the non-finite step counter is read (reading it waits for
    the device)."""

    chief: bool = True
    other_writers: int = 0  # workers that write throwaway checkpoints beside the chief's
    fit_kwargs: dict[str, Any] = {}
    skip_check_every: int = 1

    def __init__(self, config: RunConfig, images):
        """What both backends derive from the configuration alike: ``size`` (the backbone's
        input side), ``rotation`` (RotNet), ``images_per_step``, and ``mean``, ``std``: the
        dataset's normalisation (`normalization_constants`, the one rule that the probes and
        the export follow too)."""
        self.config = config
        self.images = images
        self.size = config.image_size
        self.rotation = config.pretext == "rotation"
        batch = config.train.batch_size
        self.images_per_step = batch // 4 if self.rotation else batch
        self.mean, self.std = normalization_constants(config.data.dataset)

    def build(self, steps: int) -> tuple[keras.Model, keras.Model, Any, Any]:
        """``(encoder, compiled pretext model, schedule, optimizer)`` of a ``steps``-step run,
        the same initial weights every call (seeded): `build_model` with this backend's
        inputs and scope."""
        raise NotImplementedError

    def batches(self, start: int, stop: int) -> Any:
        """The training batches of steps ``start .. stop - 1`` (what ``fit`` takes), ending
        there."""
        raise NotImplementedError

    def checkpoints(self, model: keras.Model, optimizer) -> tuple[CheckpointStore, int]:
        """The store checkpoints go to, and the step restored from its newest one (0: none)."""
        raise NotImplementedError

    def summaries(self, counter: StepCounter, schedule) -> list[keras.callbacks.Callback]:
        """The logging callbacks (`monitoring.PretextSummaries` and friends)."""
        raise NotImplementedError

    def export(self, encoder: keras.Model, model: keras.Model) -> dict:
        """``--export`` of a finished run; returns summary entries."""
        raise NotImplementedError

    def exports(self) -> bool:
        """Whether ``--export`` writes a SavedModel here (not where TensorFlow is missing)."""
        return self.config.outputs.export

    def signal_agreement(self):
        """How the workers agree to stop on a signal (`callbacks.StopOnSignal`'s ``agree``);
        None: one process."""
        return None

    def close(self) -> None:
        """Called once at the end (e.g. a non-chief worker's scratch directory)."""


def build_model(config: RunConfig, steps: int, *, inputs: str, mean, std, augment: bool,
                scope: Any = None, fused_warp: bool | None = None, one_pass: bool | None = None,
                **compile_kwargs: Any) -> tuple[keras.Model, keras.Model, Any, Any]:
    """THE pretext model of a run, for every backend: ``(encoder, model, schedule,
    optimizer)``, compiled for ``steps`` optimizer steps, the same initial weights every call.

    AET: ``config.recipe.build_model`` with ``inputs`` ("images": the pairs made inside the step;
    "warp": the warp inside, T from the pipeline; "pairs": the pipeline's pairs), then the
    model's own ``compile`` (the recipe's loss, optimizer and metrics). RotNet: the four turns
    made inside (``inputs="images"``) or by the pipeline (otherwise), the cross-entropy and the
    recipe's optimizer. ``scope``: the distribution scope to build in; ``one_pass``: how
    per-branch BatchNorm is computed (`models.aet.build_aet_model`; None: one encoder call on
    a GPU); ``compile_kwargs``: ``model.compile``'s (``jit_compile``)."""
    from aetv2_tf.models.aet import build_rotation_classifier
    from aetv2_tf.models.backbones import build_backbone
    from aetv2_tf.models.pretext import build_rotations_model

    seed, model_config = config.train.seed, config.model
    keras.utils.set_random_seed(seed)  # the same weights whatever was built before
    compile_kwargs["steps_per_execution"] = config.train.steps_per_execution
    with scope or contextlib.nullcontext():
        encoder = build_backbone(model_config.backbone.name, batch_norm=model_config.batch_norm)
        if config.pretext == "rotation":
            model = build_rotations_model(encoder, seed, augment=augment, mean=mean, std=std) \
                if inputs == "images" else build_rotation_classifier(encoder)
            schedule, optimizer = config.recipe.build_optimizer(model, steps)
            loss, metrics = program.rotation_objective()
            model.compile(optimizer=optimizer, loss=loss, metrics=metrics, **compile_kwargs)
        else:
            model = config.recipe.build_model(
                encoder, seed, inputs=inputs, shift=config.data.shift,
                decoder_scale=model_config.decoder_scale, augment=augment, mean=mean, std=std,
                init_rotation_deg=model_config.decoder_init_rotation,
                siamese_batch_norm=model_config.siamese_batch_norm, fused_warp=fused_warp,
                one_pass=one_pass)
            model.compile(steps=steps, **compile_kwargs)
            schedule, optimizer = model.schedule, model.optimizer
        optimizer.build(model.trainable_variables)
    return encoder, model, schedule, optimizer


def check_batch_fits(config: RunConfig, num_examples: int | None,
                     accelerator: bool = False) -> None:
    """A step takes ``--batch_size`` distinct images (RotNet: a quarter, in 4 rotations): fewer
    training images than that, or a step whose memory exceeds the machine's on the CPU (not
    ``accelerator``: `step_memory.check_step_memory`), is refused before the model_dir is
    written (UsageError)."""
    from aetv2_tf.errors import UsageError
    from aetv2_tf.program.step_memory import check_step_memory

    batch, rotation = config.train.batch_size, config.pretext == "rotation"
    per_step = batch // 4 if rotation else batch
    if num_examples is not None and num_examples < per_step:
        images = "a quarter of --batch_size (RotNet shows each in 4 rotations)" \
            if rotation else "--batch_size"
        raise UsageError(f"--batch_size={batch}: a step takes {per_step} training images "
                         f"({images}), but the data has only {num_examples} (--train_examples="
                         f"{config.data.train_examples}); lower --batch_size or raise "
                         "--train_examples.")
    check_step_memory(config.model.backbone.name, batch, rotation, accelerator)


def check_disk(config: RunConfig, model: keras.Model, encoder: keras.Model,
               other_writers: int = 0) -> None:
    """Fails before the first step, not at the first checkpoint hours later, when the
    model_dir's disk cannot hold what this model's run writes (`disk_bytes_needed`), counting
    the checkpoints already there as space (they are rotated out); ``other_writers`` workers
    beside the chief each keep one throwaway checkpoint under ``<model_dir>/.worker_tmp``."""
    from aetv2_tf.program import rundir
    from aetv2_tf.program.keras_checkpoints import disk_bytes_needed, list_checkpoints

    outputs = config.outputs
    needed = disk_bytes_needed(model, encoder, outputs.keep_checkpoints, outputs.export,
                               other_writers)
    present = sum(os.path.getsize(path) for _, path in
                  list_checkpoints(os.path.join(outputs.model_dir, "checkpoints")))
    rundir.check_free_space(outputs.model_dir, needed - present,
                            f"{outputs.keep_checkpoints} + 1 checkpoints of this model"
                            f"{', the final encoder and the export' if outputs.export else ''}")


@contextlib.contextmanager
def settings_as_flags(show: bool = True):
    """Inside, the library's warnings about a recipe's settings (`errors.SettingWarning`, e.g.
    a warm-up longer than half the run) are logged in the command line's words (``--warmup_steps
    =1000 ...``), or dropped where not ``show`` (a throwaway model's); other warnings pass as
    they are."""
    from absl import logging

    from aetv2_tf.errors import SettingWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SettingWarning)
        yield
    for w in caught:
        if isinstance(w.message, SettingWarning):
            if show:
                logging.warning("%s", w.message.flags)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


def export(adapter: PretextAdapter, encoder: keras.Model, model: keras.Model) -> dict:
    """``adapter.export``, its failure turned into summary entries (``export_failed``: the
    program exits 4): the training is done and its encoder written, so only the export is to
    redo."""
    try:
        out = adapter.export(encoder, model)
    except Exception as e:  # noqa: BLE001 - any failure of the export, reported, not raised
        from absl import logging

        logging.error("SavedModel export failed: %s: %s", type(e).__name__, e)
        out = {"export": f"FAILED ({type(e).__name__})"}
    if str(out.get("export", "")).startswith("FAILED"):
        out["export_failed"] = True
    return out


def completed(adapter: PretextAdapter, steps: int) -> dict | None:
    """The outputs of a run that finished all its ``steps`` before this invocation, as the
    summary `train.main` prints (``complete``: True), or None: its newest checkpoint is the one
    of step ``steps``, its ``encoder.weights.h5`` is written (a run trained on discards it
    first) and so is its SavedModel where `PretextAdapter.exports` (a failed export, exit 4,
    is redone by rerunning the command)."""
    from aetv2_tf.program.keras_checkpoints import ENCODER_WEIGHTS, list_checkpoints

    model_dir = adapter.config.outputs.model_dir
    found = list_checkpoints(os.path.join(model_dir, "checkpoints"))
    encoder = os.path.join(model_dir, ENCODER_WEIGHTS)
    export = os.path.join(model_dir, "export", "encoder")
    if not found or found[-1][0] != steps or not os.path.isfile(encoder):
        return None
    outputs = dict(complete=True, steps=steps, encoder_weights=encoder)
    if adapter.exports():
        if not os.path.isfile(os.path.join(export, "saved_model.pb")):
            return None
        outputs["export"] = export
    return outputs


def run(adapter: PretextAdapter, images, labels, num_examples: int | None) -> dict:
    """Trains the run's pretext model with ``adapter``; returns the summary `train.main`
    prints (`common.fit_and_summarize`, plus what a finished run wrote). A run that finished
    before (`completed`) trains, exports and scores nothing: its outputs are the summary."""
    config = adapter.config
    train, outputs = config.train, config.outputs

    def fit_first_steps(n: int, timer: keras.callbacks.Callback) -> None:
        with settings_as_flags(show=False):  # a throwaway model of a few steps
            model = adapter.build(n)[1]
        model.fit(adapter.batches(0, n), epochs=1, steps_per_epoch=n, callbacks=[timer],
                  verbose=0, **adapter.fit_kwargs)

    budget = run_length.budget_steps(config, fit_first_steps, writer=adapter.chief) \
        if train.train_seconds else 0
    per_epoch, steps = run_length.total_steps(config, num_examples, adapter.images_per_step,
                                              budget)
    done = completed(adapter, steps)
    if done is not None:
        adapter.close()
        return done
    with settings_as_flags():
        encoder, model, schedule, optimizer = adapter.build(steps)
    store, start = adapter.checkpoints(model, optimizer)
    stop = run_length.stop_step(config, start, steps)
    if adapter.chief and start < stop:
        check_disk(config, model, encoder, adapter.other_writers)
    counter = StepCounter(start, stop)
    saver = CheckpointEvery(store, counter, outputs.checkpoint_every_steps, writer=adapter.chief)
    deadline = run_length.deadline(config)
    callbacks = [counter,
                 StopOnSkippedStep(optimizer, counter, train.on_nonfinite == "stop",
                                   every=adapter.skip_check_every),
                 StopAtStep(stop, counter),
                 *([StopAtDeadline(deadline)] if deadline else []),
                 # before the saver: no checkpoint of the weights whose loss grew
                 StopOnLossGrowth(saver, counter, train.max_loss_growth),
                 saver,
                 # after CheckpointEvery: its handlers outlive the final save
                 StopOnSignal(adapter.signal_agreement()),
                 *adapter.summaries(counter, schedule)]
    if adapter.chief and start < stop:
        discard_encoder_weights(outputs.model_dir)  # it would describe an older end of the run
    summary, finished = program.fit_and_summarize(
        config, model, adapter.batches(start, stop), start, stop, steps, per_epoch, callbacks,
        **adapter.fit_kwargs)
    if adapter.chief and finished:
        summary["encoder_weights"] = save_encoder_weights(encoder, config.model.backbone.name,
                                                          outputs.model_dir)
        if outputs.export:
            summary.update(export(adapter, encoder, model))
        if outputs.quick_knn_train:
            summary.update(program.quick_knn_summary(config, encoder, images, labels))
    adapter.close()
    return summary
