"""The pretext stage (AET or RotNet pretraining) of every Keras backend: one training loop.

    images (`load`) -> --train_seconds budget -> steps -> model -> resume -> fit to the stop
    (`run_control.RunControl`) -> summary -> (finished) encoder.weights.h5, --export, quick KNN

What a backend does its own way is its `backend.Backend`: where the pairs are made (its
``inputs`` of `build_model`), the distribution scope, the batches of steps ``start .. stop -
1``, the checkpoint store it resumes from, the summaries and the export. Both backends build
their model through `build_model` (the recipe's `build_model` and the model's own
``compile``: the one assembly path of the library) and save Keras ``.weights.h5``
checkpoints. Everything else is here once.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from typing import TYPE_CHECKING, Any

import keras
from absl import logging

from aetv2_tf.errors import UsageError
from aetv2_tf.files.digests import weights_digest
from aetv2_tf.files.savedmodel import TF_CHECKPOINTS_RESUMED_BY
from aetv2_tf.program import run_length
from aetv2_tf.program.checkpoint_saver import CheckpointSaver, CheckpointStore
from aetv2_tf.program.config import RunConfig
from aetv2_tf.program.divergence import LossGrowth, NonFiniteSteps, skipped_steps
from aetv2_tf.program.keras_checkpoints import (
    ENCODER_WEIGHTS,
    discard_encoder_weights,
    list_checkpoints,
    save_encoder_weights,
)
from aetv2_tf.program.pretext_data import PretextData, read
from aetv2_tf.program.run_control import Outcome, RunControl, StageResult
from aetv2_tf.program.signal_stop import SignalStop, interrupting

if TYPE_CHECKING:
    from aetv2_tf.program.backend import Backend

def load(config: RunConfig, accelerator: bool = False) -> PretextData:
    """Reads and checks the training images (`pretext_data.read`), the batch against them and
    the machine (`check_batch_fits`) and the model_dir's checkpoints (`check_resumable`): before
    the model_dir is written."""
    data = read(config)
    check_batch_fits(config, data.num_examples, accelerator)
    check_resumable(config.outputs.model_dir)
    return data


def check_resumable(model_dir: str) -> None:
    """A run whose checkpoints are all in the `tf.train.Checkpoint` format of aetv2_tf 0.1
    (``checkpoints/checkpoint``, ``ckpt-<step>.index``) is refused, naming the version that
    resumes it (UsageError, before anything is written)."""
    directory = os.path.join(model_dir, "checkpoints")
    if list_checkpoints(directory) or not os.path.isfile(os.path.join(directory, "checkpoint")):
        return
    raise UsageError(
        f"--model_dir={model_dir} holds checkpoints in the tf.train.Checkpoint format of "
        f"aetv2_tf 0.1 ({directory}/checkpoint), which this version does not read: resume the "
        f"run with the last version that does (git checkout {TF_CHECKPOINTS_RESUMED_BY}, then "
        "the same command; it goes on in .weights.h5 checkpoints, which this version resumes), "
        "or choose a new --model_dir. Nothing was changed.")


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
            schedule, optimizer = config.recipe.build_optimizer(steps)
            model.compile(  # the cross-entropy over the 4 quarter turns, its accuracy
                optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(True),
                metrics=[keras.metrics.SparseCategoricalAccuracy("rotation_accuracy")],
                **compile_kwargs)
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
    from aetv2_tf.program.keras_checkpoints import disk_bytes_needed

    outputs = config.outputs
    needed = disk_bytes_needed(model, encoder, outputs.keep_checkpoints, outputs.export,
                               other_writers)
    present = sum(os.path.getsize(path) for _, path in
                  list_checkpoints(os.path.join(outputs.model_dir, "checkpoints")))
    rundir.check_free_space(outputs.model_dir, needed - present,
                            f"{outputs.keep_checkpoints} + 1 checkpoints of this model"
                            f"{', the final encoder and the export' if outputs.export else ''}")


#: The settings that the library's warnings name (`errors.SettingWarning.settings`) -> the flag
#: that sets each on the command line.
SETTING_FLAGS = {"warmup_steps": "warmup_steps", "learning_rate": "learning_rate",
                 "steps": "train_steps", "decoder_scale": "decoder_scale"}


@contextlib.contextmanager
def settings_as_flags(show: bool = True):
    """Inside, the library's warnings about a recipe's settings (`errors.SettingWarning`, e.g.
    a warm-up longer than half the run) are logged with the flags that set them
    (`SETTING_FLAGS`), or dropped where not ``show`` (a throwaway model's); other warnings pass
    as they are."""
    from aetv2_tf.errors import SettingWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SettingWarning)
        yield
    for w in caught:
        if not isinstance(w.message, SettingWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
        elif show:
            named = [f"--{SETTING_FLAGS[s]}" for s in w.message.settings if s in SETTING_FLAGS]
            logging.warning("%s%s", w.message, f" (flags: {', '.join(named)})" if named else "")


def export(backend: Backend, encoder: keras.Model, model: keras.Model) -> tuple[dict, bool]:
    """``backend.export`` and whether it failed (the program exits 4), its failure turned into
    summary entries: the training is done and its encoder written, so only the export is to
    redo."""
    encoder_file = os.path.join(backend.config.outputs.model_dir, ENCODER_WEIGHTS)
    try:
        with interrupting(f"during the export: nothing of it was kept; the training is finished "
                          f"(its encoder: {encoder_file}); rerun the same command to export it"):
            out = backend.export(encoder, model)
    except Exception as e:  # noqa: BLE001 - any failure of the export, reported, not raised
        logging.error("SavedModel export failed: %s: %s", type(e).__name__, e)
        out = {"export": f"FAILED ({type(e).__name__})"}
    failed = str(out.get("export", "")).startswith("FAILED")
    return ({**out, "export_failed": True} if failed else out), failed


def completed(backend: Backend, steps: int) -> dict | None:
    """The outputs of a run that finished all its ``steps`` before this invocation, as the
    summary `train.main` prints, or None: its newest checkpoint is the one of step ``steps``,
    its ``encoder.weights.h5`` is written (a run trained on discards it first) and so is its
    SavedModel where `Backend.exports` (a failed export, exit 4, is redone by rerunning the
    command)."""
    model_dir = backend.config.outputs.model_dir
    found = list_checkpoints(os.path.join(model_dir, "checkpoints"))
    encoder = os.path.join(model_dir, ENCODER_WEIGHTS)
    export_dir = os.path.join(model_dir, "export", "encoder")
    if not found or found[-1][0] != steps or not os.path.isfile(encoder):
        return None
    outputs = dict(steps=steps, encoder_weights=encoder)
    if backend.exports():
        if not os.path.isfile(os.path.join(export_dir, "saved_model.pb")):
            return None
        outputs["export"] = export_dir
    return outputs


def run_steps(config: RunConfig, backend: Backend, data: PretextData) -> tuple[int, int]:
    """``(steps per epoch, the run's steps)``: ``--train_seconds`` measured on a throwaway
    model of a few steps (`run_length.budget_steps`), else ``--train_steps`` or ``--epochs``."""

    def fit_first_steps(n: int, timer: keras.callbacks.Callback) -> None:
        with settings_as_flags(show=False):  # a throwaway model of a few steps
            model = backend.build(data, n)[1]
        model.fit(backend.batches(data, 0, n), epochs=1, steps_per_epoch=n, callbacks=[timer],
                  verbose=0, **backend.fit_kwargs)

    budget = run_length.budget_steps(config, fit_first_steps, writer=backend.chief) \
        if config.train.train_seconds else 0
    return run_length.total_steps(config, data.num_examples, data.images_per_step, budget)


def train(config: RunConfig, backend: Backend, data: PretextData) -> StageResult:
    """Trains the run's pretext model on ``backend``; returns what `train.main` prints and
    exits with: the summary (`fit`, plus what a finished run wrote) and the outcome. A run
    that finished before (`completed`) trains, exports and scores nothing."""
    outputs = config.outputs
    per_epoch, steps = run_steps(config, backend, data)
    done = completed(backend, steps)
    if done is not None:
        backend.close()
        return StageResult(done, Outcome(steps, steps), finished_before=True)
    with settings_as_flags():
        encoder, model, schedule, optimizer = backend.build(data, steps)
    store, start = backend.checkpoints(model, optimizer)
    stop = run_length.stop_step(config, start, steps)
    if backend.chief and start < stop:
        check_disk(config, model, encoder, backend.other_writers)
        discard_encoder_weights(outputs.model_dir)  # it would describe an older end of the run
    control = run_control_of(config, backend, store, (start, stop, steps))
    summary, outcome = fit(config, model, backend.batches(data, start, stop), control,
                           backend.summaries(data, lambda: control.step, schedule), per_epoch,
                           backend.fit_kwargs)
    export_failed = False
    if backend.chief and outcome.finished:
        summary["encoder_weights"] = save_encoder_weights(encoder, config.model.backbone.name,
                                                          outputs.model_dir)
        if outputs.export:
            entries, export_failed = export(backend, encoder, model)
            summary.update(entries)
        if outputs.quick_knn_train:
            summary.update(quick_knn_summary(config, encoder, data))
    backend.close()
    return StageResult(summary, outcome, export_failed=export_failed)


def run_control_of(config: RunConfig, backend: Backend, store: CheckpointStore,
                   span: tuple[int, int, int]) -> RunControl:
    """The run's `RunControl` over ``span`` (from step ``start`` to ``stop`` of ``steps``):
    checkpoints every ``--checkpoint_every_steps`` into ``store``, ``--on_nonfinite``,
    ``--max_loss_growth``, ``--stop_after_seconds``, the signals (agreed among workers) and
    weights that the steps leave unchanged."""
    train = config.train
    return RunControl(
        *span,
        saver=CheckpointSaver(store, config.outputs.checkpoint_every_steps, backend.chief),
        nonfinite=NonFiniteSteps(train.on_nonfinite == "stop", every=backend.skip_check_every()),
        growth=LossGrowth(train.max_loss_growth), signals=SignalStop(backend.signal_agreement()),
        deadline=run_length.deadline(config), watch_weights=True)


def fit(config: RunConfig, model: keras.Model, batches, control: RunControl, summaries: list,
        per_epoch: int, fit_kwargs: dict) -> tuple[dict, Outcome]:
    """``model.fit`` of steps ``control.step .. control.stop - 1`` on ``batches`` (which end
    after step ``stop - 1``) under ``control``, with the ``summaries`` and the program's
    `monitoring.ProgressBar` where ``--verbose``; then the run's summary (``steps`` reached,
    the last logs in the order shown, the digest of the trainable weights, what stopped it)
    and its `Outcome`."""
    from aetv2_tf.method.metrics import shown_order
    from aetv2_tf.program.monitoring import ProgressBar

    train, start, stop = config.train, control.step, control.stop
    callbacks = [control, *summaries]
    if config.outputs.verbose:  # Keras's bar, the loss first and stopping where it stops
        callbacks.append(ProgressBar(lambda: control.step >= control.steps))
    t0 = time.perf_counter()
    history = {}
    if start < stop:
        try:
            fitted = model.fit(batches, callbacks=callbacks, verbose=config.outputs.verbose,
                               **fit_kwargs, **run_length.fit_epochs(
                                   start, stop, per_epoch, train.steps_per_execution))
        finally:
            control.close()
        history = {k: float(fitted.history[k][-1]) for k in shown_order(fitted.history)}
    wall = time.perf_counter() - t0
    outcome = control.outcome()
    summary = dict(steps=outcome.step, start_step=start, wall_time_s=round(wall, 1),
                   pairs_per_sec=round((outcome.step - start) * train.batch_size /
                                       max(wall, 1e-9), 1),
                   **history, trainable_digest=weights_digest(model.trainable_weights))
    skipped = skipped_steps(model.optimizer)
    if skipped:
        summary["skipped_steps"] = skipped
    summary.update(outcome.entries())
    return summary, outcome


def quick_knn_summary(config: RunConfig, encoder: keras.Model, data: PretextData) -> dict:
    """``--quick_knn_train/test``: KNN of the trained and of a random-init encoder (seeded by
    ``--seed``, as ``--pretrained=none``) on the first training and test images; printed and
    returned (`probes.quick_knn`)."""
    from aetv2_tf.data.sources import load_source
    from aetv2_tf.models.backbones import build_backbone
    from aetv2_tf.probes.quick_knn import quick_knn

    if data.labels is None:
        logging.warning("--quick_knn_train: only for CIFAR-10 from its python files; skipped.")
        return {}
    dataset, backbone = config.data, config.model.backbone
    test_images, test_labels = load_source(dataset.dataset, dataset.data_dir, "test")
    keras.utils.set_random_seed(config.train.seed)  # the random init of --pretrained=none
    random_encoder = build_backbone(backbone.name, tuple(data.images.shape[1:]),
                                    config.model.batch_norm)
    n, m = config.outputs.quick_knn_train, config.outputs.quick_knn_test
    train_set = (data.images[:n], data.labels[:n])
    test_set = (test_images[:m], test_labels[:m])
    feature = backbone.probe_feature
    result = quick_knn(encoder, random_encoder, train_set, test_set, feature, data.mean,
                       data.std)
    print(f"Quick KNN (the authors': k=10, Euclidean, {feature} pooled 2x2; first "
          f"{len(train_set[0])} training images vs first {len(test_set[0])} test images): "
          f"{result['knn_top1']:.2f}% trained vs {result['random_knn_top1']:.2f}% random init "
          f"({result['knn_gain']:+.2f} points, {result['knn_seconds']:.0f} s).", flush=True)
    return result
