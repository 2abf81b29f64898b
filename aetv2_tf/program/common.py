"""The backend-neutral parts of the training program (`python -m aetv2_tf.train`).

`program.adapter_tensorflow` (tf.distribute, tf.data, TensorBoard, SavedModel) and
`program.adapter_portable` (the adapter of the other Keras backends: JAX,
`keras.distribution`, the NumPy stream with on-device warping) both build their stage from these
pieces, so each idea exists once: the flag checks of every backend, the loss, metrics, schedule
and optimizer of the flags, the training images, the step arithmetic, the stop at an exact step,
the start line and the quick KNN. Nothing here imports TensorFlow; neither adapter is imported.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

import keras
from absl import logging

from aetv2_tf.errors import UsageError
from aetv2_tf.program import flag_support
from aetv2_tf.program.flags import FLAGS
from aetv2_tf.program.precision import Choice
from aetv2_tf.recipes import Recipe

#: Input side of each backbone (square images).
IMAGE_SIZE = {"nin": 32, "alexnet": 224}


def check_flags(num_replicas: int, backend: str, accelerator: bool) -> None:
    """Every check that does not depend on the backend's libraries, then the flag-support table
    of `backend` (`flag_support`): rejects contradictory or unsupported flags before anything is
    written. `accelerator`: a GPU or TPU is visible."""
    F = FLAGS
    if F.stage == "pretext" and not (F.epochs or F.train_steps or F.train_seconds):
        raise UsageError("pass --epochs, --train_steps or --train_seconds (all are 0).")
    if F.batch_size % num_replicas:
        raise UsageError(f"--batch_size={F.batch_size} is not divisible by the {num_replicas} "
                         f"replicas of --strategy={F.strategy}; use a multiple of {num_replicas}.")
    if F.dataset == "cifar10" and F.backbone == "alexnet":
        raise UsageError("--backbone=alexnet expects 224x224 images, --dataset=cifar10 has 32x32; "
                         "use --backbone=nin for CIFAR-10.")
    if F.dataset not in ("cifar10", "folder") and F.backbone == "nin":
        raise UsageError(f"--backbone=nin is the CIFAR-10 network (also for folders of small "
                         f"images, cropped to 32 px); use --backbone=alexnet for "
                         f"--dataset={F.dataset}.")
    if F.stage == "probe" and not F.pretrained:
        raise UsageError("--stage=probe needs --pretrained=<model_dir|SavedModel dir|none>.")
    if F.train_seconds and F.strategy in ("multi_worker_mirrored", "tpu"):
        raise UsageError(f"--train_seconds times this machine alone; with --strategy="
                         f"{F.strategy} pass --train_steps (every worker the same).")
    if F.stop_after_seconds and F.strategy in ("multi_worker_mirrored", "tpu"):
        raise UsageError(f"--stop_after_seconds reads this machine's clock alone; with "
                         f"--strategy={F.strategy} pass --stop_after_steps (every worker stops "
                         "at the same step).")
    if F.train_seconds and not F.overwrite:
        recorded_budget()  # a resumed budgeted run keeps the budget that sized it
    if F.mixed_precision == "mixed_float16" and not accelerator:
        raise UsageError("--mixed_precision=mixed_float16 needs a GPU; on a CPU use "
                         "mixed_bfloat16 (fast with AMX) or none.")
    if F.pretext == "rotation" and F.stage == "pretext" and F.batch_size % 4:
        raise UsageError(f"--pretext=rotation shows each image in its 4 rotations: "
                         f"--batch_size={F.batch_size} must be a multiple of 4.")
    lr_drops()  # a bad --lr_drop_epochs fails here
    if F.mse_target == "official" and F.pretext == "aet" and F.loss != "mse":
        raise UsageError("--mse_target=official is the AETv1 MSE's target: use it with "
                         "--loss=mse (configs/cifar10_aetv1_official.cfg).")
    if F.mse_target == "official" and F.decoder_scale:
        raise UsageError("--mse_target=official regresses the AETv1 code's own normalised "
                         "targets: drop --decoder_scale.")
    if F.pretext == "rotation" and F.loss == "mse" and F.stage == "pretext":
        logging.info("--loss is ignored by --pretext=rotation (cross-entropy over 4 rotations).")
    flag_support.check(backend, {name: FLAGS[name] for name in flag_support.TABLE})


def lr_drops() -> tuple[float, ...]:
    """`--lr_drop_epochs` as fractions of the run (epoch e of --epochs: e / epochs, also when
    --train_steps sets the length; drops past the end never happen); () when it is empty (the
    schedule's own 30/60/80%)."""
    F = FLAGS
    if not F.lr_drop_epochs:
        return ()
    try:
        epochs = [int(e) for e in F.lr_drop_epochs]
    except ValueError as e:
        raise UsageError(f"--lr_drop_epochs={','.join(F.lr_drop_epochs)}: whole epochs, e.g. "
                         "5,15,25.") from e
    if F.lr_schedule != "step" or not F.epochs:
        raise UsageError("--lr_drop_epochs needs --lr_schedule=step and --epochs (the drops are "
                         f"epochs of it); got --lr_schedule={F.lr_schedule} --epochs={F.epochs}.")
    if epochs != sorted(set(epochs)) or epochs[0] < 1:
        raise UsageError(f"--lr_drop_epochs={','.join(F.lr_drop_epochs)}: increasing epochs "
                         "from 1 on, e.g. 5,15,25.")
    if epochs[-1] >= F.epochs:  # a shortened run (--epochs=2 for a check) keeps its config
        logging.info("--lr_drop_epochs: the drops at epochs >= --epochs=%d do not happen.",
                     F.epochs)
    return tuple(e / F.epochs for e in epochs)


def recipe() -> Recipe:
    """The flags' pretraining recipe (`aetv2_tf.recipes.Recipe`): the program builds its loss and
    optimizer with the same public constructors a Python user calls."""
    return Recipe.from_flags(FLAGS, lr_drops())


def pretext_loss(param_std, image_size: int, step) -> tuple[keras.losses.Loss, list]:
    """The pretext loss of the flags and its metrics: RotNet's cross-entropy over the 4 turns,
    or the AET loss (geodesic: AETv2, mse: AETv1) and the pretext metrics.

    `step`: the variable an MSE warm-up (`--mse_decay_steps`) reads: the optimizer's iterations
    under TensorFlow, a model counter carried through the jitted step under JAX (`models.pairs`).
    """
    if FLAGS.pretext == "rotation":
        return (keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                [keras.metrics.SparseCategoricalAccuracy(name="rotation_accuracy")])
    flags_recipe = recipe()
    return flags_recipe.build_loss(image_size, param_std, step), flags_recipe.metrics()


def schedule_and_optimizer(model: keras.Model, steps: int):
    """The learning-rate schedule and optimizer of the flags; `--weight_decay_mode=l2` adds the
    decay to `model`'s losses. Call inside the distribution scope."""
    return recipe().build_optimizer(model, steps)


def batch_norm() -> str:
    """`--batch_norm`, where the backend has it: `fused` is TensorFlow's kernel of the same
    computation (interchangeable weights), so other backends build Keras's BatchNorm."""
    return FLAGS.batch_norm if keras.backend.backend() == "tensorflow" else "keras"


def data_dir() -> str | None:
    """`--data_dir` with `~` expanded (None: the dataset's default place)."""
    return os.path.expanduser(FLAGS.data_dir) if FLAGS.data_dir else None


def load_train_images(split: str = "train"):
    """The stage's images: numpy (N, H, W, 3) uint8 + labels for CIFAR-10 from its python files,
    the checked file list of a folder (`ImageFiles`: `--train_examples` takes a seeded random
    subset), else a tf.data source (TensorFlow): `(images, labels or None, size or None)`."""
    from aetv2_tf.data.files import ImageFiles
    from aetv2_tf.data.sources import load_source

    source = load_source(FLAGS.dataset, data_dir(), split, download=FLAGS.download,
                         shuffle_seed=FLAGS.seed)
    if isinstance(source, ImageFiles):
        if split == "train" and FLAGS.train_examples:
            source = source.subset(FLAGS.train_examples, FLAGS.seed)
        return source, None, len(source.paths)
    if isinstance(source, tuple):
        images, labels = source
        if split == "train" and FLAGS.train_examples:
            images, labels = images[: FLAGS.train_examples], labels[: FLAGS.train_examples]
        return images, labels, len(images)
    if split == "train" and FLAGS.train_examples:
        source = source.take(FLAGS.train_examples)
    size = int(source.cardinality())  # known for tensorflow-datasets splits and folders
    return source, None, size if size >= 0 else None


def total_steps(num_examples: int | None, images_per_step: int,
                train_steps: int = 0) -> tuple[int, int]:
    """(steps per epoch, total steps) from `train_steps` (`--train_seconds`' count), else
    --train_steps, else --epochs.

    `images_per_step` is the number of distinct training images a step consumes: the batch for
    AET pairs, a quarter of it for RotNet (each image appears in its 4 rotations).
    """
    train_steps = train_steps or FLAGS.train_steps
    if num_examples is None and not train_steps:
        raise UsageError("the dataset size is unknown here: pass --train_steps.")
    per_epoch = max((num_examples or train_steps * images_per_step) // images_per_step, 1)
    steps = train_steps or FLAGS.epochs * per_epoch
    if steps > flag_support.MAX_INT:
        raise UsageError(f"--epochs={FLAGS.epochs} of {per_epoch} steps is {steps} steps, more "
                         f"than the {flag_support.MAX_INT} a run counts; pass fewer --epochs.")
    return min(per_epoch, steps), steps


BUDGET_FILE = "budget.json"
#: Pairs after which the quickstart's quick KNN showed learning: 400 x 64 gained +4.4 to +5.5
#: points over the random init, 68 x 64 about +1 (docs/reproduction.md, "The quickstart").
LEARNING_VISIBLE_PAIRS = 25_600


def recorded_budget() -> dict | None:
    """The `--train_seconds` record of `--model_dir` (None: none); refuses another budget."""
    F = FLAGS
    path = os.path.join(F.model_dir, BUDGET_FILE)
    if F.stage != "pretext" or not os.path.isfile(path):
        return None
    with open(path) as f:
        recorded = json.load(f)
    if recorded.get("train_seconds") != F.train_seconds:
        raise UsageError(f"--train_seconds={F.train_seconds:g} differs from the "
                         f"{recorded.get('train_seconds')} that sized the run in {path} "
                         f"(--train_steps={recorded.get('train_steps')}); resume with "
                         f"--train_seconds={recorded.get('train_seconds')}, or start afresh in a "
                         f"new --model_dir.")
    return recorded


class StepTimes(keras.callbacks.Callback):
    """`(steps done, time.perf_counter())` at the end of every execution of `fit`."""

    def __init__(self):
        super().__init__()
        self.marks: list[tuple[int, float]] = []

    def on_train_batch_end(self, batch, logs=None):
        self.marks.append((int(batch) + 1, time.perf_counter()))


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def budget_steps(fit_first_steps: Callable[[int, keras.callbacks.Callback], None],
                 writer: bool = True, executions: int = 5) -> int:
    """`--train_seconds`: the steps that fill that many seconds of training on this machine.

    On a resume, the count recorded in `<model_dir>/budget.json`; else measured:
    `fit_first_steps(n, timer)` trains a THROWAWAY model (the caller then re-seeds and builds
    the real one) for `executions` executions of `--steps_per_execution` steps, and the rate of
    all but the first two (which trace or compile and warm up) sets the count. The run is then
    the run of `--train_steps=<count>` (same schedule, data and weights). Prints one line that
    says how long training will take; `writer` (the chief) records the count.
    """
    F = FLAGS
    path = os.path.join(F.model_dir, BUDGET_FILE)
    try:
        recorded = recorded_budget()
    except UsageError:
        if not F.overwrite:
            raise
        recorded = None  # --overwrite: another budget is measured anew
    if recorded:
        return int(recorded["train_steps"])
    timer = StepTimes()
    fit_first_steps(executions * F.steps_per_execution, timer)
    (s0, t0), (s1, t1) = timer.marks[1], timer.marks[-1]
    rate = (s1 - s0) / max(t1 - t0, 1e-9)  # steps per second
    steps = min(max(int(F.train_seconds * rate), 1), flag_support.MAX_INT)
    record = dict(train_seconds=F.train_seconds, train_steps=steps,
                  pairs_per_sec=round(rate * F.batch_size, 1), timed_steps=s1 - s0,
                  measured=time.strftime("%Y-%m-%d %H:%M:%S"))
    if writer:
        from aetv2_tf.safe_paths import write_text_atomically

        write_text_atomically(path, json.dumps(record, indent=1))
    print(f"Time budget --train_seconds={F.train_seconds:g}: {record['pairs_per_sec']} pairs/s "
          f"measured here -> --train_steps={steps} of {F.batch_size} pairs, about "
          f"{_duration(steps / rate)} of training (recorded in {path}).", flush=True)
    if F.quick_knn_train and steps * F.batch_size < LEARNING_VISIBLE_PAIRS:
        enough = 10 * -(-LEARNING_VISIBLE_PAIRS // (10 * record["pairs_per_sec"]))
        print(f"Note: {steps * F.batch_size:,} pairs are few for the quick KNN to show learning "
              f"(the quickstart gained about +1 point over the random init at 4,352 pairs, +4.4 "
              f"to +5.5 at {LEARNING_VISIBLE_PAIRS:,}: docs/reproduction.md); on this machine "
              f"--train_seconds={enough:.0f} trains {LEARNING_VISIBLE_PAIRS:,}.", flush=True)
    return steps


def stop_step(start: int, steps: int) -> int:
    """Where this invocation ends: `steps`, or earlier by `--stop_after_steps`."""
    return min(steps, start + FLAGS.stop_after_steps) if FLAGS.stop_after_steps else steps


def fit_epochs(start: int, stop: int, per_epoch: int, steps_per_execution: int) -> dict:
    """`model.fit`'s epoch arguments for training steps `start .. stop - 1` on data that ends
    after step `stop - 1`: Keras epochs of a multiple of `steps_per_execution` steps (an
    execution never straddles two epochs, so none takes a batch of the next), numbered on from
    `start`. Only the very last execution can be short: there the data ends, and
    `callbacks.StepCounter` (capped at `stop`) counts exactly the batches consumed."""
    size = -(-min(per_epoch, stop - start) // steps_per_execution) * steps_per_execution
    first = start // size
    return dict(steps_per_epoch=size, initial_epoch=first,
                epochs=first + -(-(stop - start) // size))


def fit_and_summarize(model: keras.Model, data, start: int, stop: int, steps: int,
                      per_epoch: int, callbacks: list, **fit_kwargs) -> tuple[dict, bool]:
    """`model.fit` of steps `start .. stop - 1` on `data` (which ends after step `stop - 1`),
    then the run's summary and whether it FINISHED (reached all `steps` cleanly: the adapter
    then writes the encoder, exports, runs the quick KNN). `callbacks` holds the run's
    `StepCounter`, `StopOnSignal`, `StopOnSkippedStep` and checkpoint saver (with `refused`)."""
    from aetv2_tf.program.callbacks import (
        StepCounter,
        StopOnSignal,
        StopOnSkippedStep,
        weights_digest,
    )
    from aetv2_tf.program.loss_growth import StopOnLossGrowth

    F = FLAGS
    counter, signals, skips = (next(c for c in callbacks if isinstance(c, kind))
                               for kind in (StepCounter, StopOnSignal, StopOnSkippedStep))
    saver = next(c for c in callbacks if hasattr(c, "refused"))
    growth = next((c for c in callbacks if isinstance(c, StopOnLossGrowth)), None)
    t0 = time.perf_counter()
    history = {}
    if start < stop:
        fit = model.fit(data, callbacks=callbacks, verbose=F.verbose, **fit_kwargs,
                        **fit_epochs(start, stop, per_epoch, F.steps_per_execution))
        history = {k: float(v[-1]) for k, v in fit.history.items()}
    wall = time.perf_counter() - t0
    done = counter()
    summary = dict(steps=done, start_step=start, wall_time_s=round(wall, 1),
                   pairs_per_sec=round((done - start) * F.batch_size / max(wall, 1e-9), 1),
                   **history, trainable_digest=weights_digest(model.trainable_weights))
    skipped = getattr(model.optimizer, "skipped_steps", None)
    if skipped is not None and int(keras.ops.convert_to_numpy(skipped.value)):
        summary["skipped_steps"] = int(keras.ops.convert_to_numpy(skipped.value))
    if any(isinstance(c, StopAtDeadline) and c.reached for c in callbacks):
        summary["stopped_at_deadline"] = True  # --stop_after_seconds: not an error, not the end
    outcomes = dict(interrupted_by=signals.received, diverged=skips.diverged,
                    stopped_nonfinite=skips.stopped, nonfinite_weights=saver.refused,
                    loss_grew=growth.grew if growth else None)
    summary.update({key: value for key, value in outcomes.items() if value})
    return summary, done >= steps and not any(outcomes.values())


class StopAtStep(keras.callbacks.Callback):
    """Ends `fit` at exactly `steps` steps (epochs may be offset after a resume); `step_fn()` is
    the number of batches consumed."""

    def __init__(self, steps: int, step_fn):
        super().__init__()
        self.steps, self.step_fn = steps, step_fn

    def on_train_batch_end(self, batch, logs=None):
        if self.step_fn() >= self.steps:
            self.model.stop_training = True


class StopAtDeadline(keras.callbacks.Callback):
    """Ends `fit` after the step (execution) during which `clock()` reached `deadline`; the
    checkpoint saver then writes the step reached (`callbacks.CheckpointEvery.on_train_end`).
    `reached`: whether it did."""

    def __init__(self, deadline: float, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.deadline, self.clock = deadline, clock
        self.reached = False

    def on_train_batch_end(self, batch, logs=None):
        if self.clock() >= self.deadline:
            self.reached = self.model.stop_training = True


def deadline() -> float | None:
    """`--stop_after_seconds` as a `time.monotonic()` deadline from the program's start
    (`program.STARTED`); None when off."""
    from aetv2_tf.program import STARTED

    return STARTED + FLAGS.stop_after_seconds if FLAGS.stop_after_seconds else None


def start_line(distribution: str, replicas: int, precision: Choice, data, kernels: str = "") -> str:
    """One line: what runs, on which data, distribution, precision (and why) and, where given,
    the CPU kernels (`kernels`, e.g. "oneDNN on")."""
    F = FLAGS
    if F.stage == "pretext":
        what = "RotNet" if F.pretext == "rotation" else \
            {"geodesic": "AETv2 (geodesic loss)", "mse": "AETv1 (parameter MSE)"}[F.loss]
    else:
        what = f"{F.probe} probe of {F.pretrained}" if F.stage == "probe" else "supervised NIN"
    images = f", {data[2]} training images" if data and data[2] else ""
    return (f"aetv2_tf {F.stage}: {what} | {F.dataset}{images} | "
            f"{distribution} x{replicas} | "
            f"{precision.policy} ({precision.reason}) | {kernels + ' | ' if kernels else ''}"
            f"{F.model_dir}")


def quick_knn_summary(encoder: keras.Model, images, labels) -> dict:
    """`--quick_knn_train/test`: KNN of the trained and of a random-init encoder (seeded by
    `--seed`, as `--pretrained=none`) on the first training and test images; printed and
    returned (`probes.quick`)."""
    from aetv2_tf.data.constants import normalization_constants
    from aetv2_tf.data.sources import load_source
    from aetv2_tf.models import build_backbone
    from aetv2_tf.probes.quick import FEATURE, quick_knn

    F = FLAGS
    if labels is None:
        logging.warning("--quick_knn_train: only for CIFAR-10 from its python files; skipped.")
        return {}
    test_images, test_labels = load_source(F.dataset, data_dir(), "test")
    keras.utils.set_random_seed(F.seed)  # the random init of --pretrained=none, same seed
    random_encoder = build_backbone(F.backbone, tuple(images.shape[1:]),
                                    batch_norm=batch_norm())
    n, m = F.quick_knn_train, F.quick_knn_test
    train_set, test_set = (images[:n], labels[:n]), (test_images[:m], test_labels[:m])
    result = quick_knn(encoder, random_encoder, train_set, test_set, FEATURE[F.backbone],
                       *normalization_constants(F.dataset))
    print(f"Quick KNN (the authors': k=10, Euclidean, {FEATURE[F.backbone]} pooled 2x2; first "
          f"{len(train_set[0])} "
          f"training images vs first {len(test_set[0])} test images): "
          f"{result['knn_top1']:.2f}% trained vs {result['random_knn_top1']:.2f}% random init "
          f"({result['knn_gain']:+.2f} points, {result['knn_seconds']:.0f} s).", flush=True)
    return result


def continue_earlier_run() -> None:
    """A `--model_dir` holding a run of an earlier version resumes as it trained: flags whose
    default changed since take the value it had (`flags.adopt_earlier_defaults`), and so do the
    loss flags of a config whose recipe changed since (`flags.adopt_earlier_recipe`), unless
    given or `--overwrite` starts afresh. A missing or unreadable flags.json changes nothing
    (the model_dir's own checks report it)."""
    import sys

    from aetv2_tf.program.flags import adopt_earlier_defaults, adopt_earlier_recipe

    path = os.path.join(FLAGS.model_dir or "", "flags.json")
    if FLAGS.overwrite or FLAGS.stage != "pretext" or not os.path.isfile(path):
        return
    try:
        with open(path) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return
    if not isinstance(saved, dict):
        return
    made = adopt_earlier_defaults(saved) + adopt_earlier_recipe(saved, sys.argv[1:])
    if made:
        logging.info("%s records a run of an earlier version: it continues with %s.", path,
                     " ".join(made))
        print(f"Resuming a run of an earlier version: {' '.join(made)} (as it trained).",
              flush=True)
