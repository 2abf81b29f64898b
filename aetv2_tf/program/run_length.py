"""How long a pretraining run is, and where this invocation of it stops (every backend):
`total_steps` (``--train_steps`` or ``--epochs``), `budget_steps` (``--train_seconds``),
`stop_step` and `deadline` (``--stop_after_steps``, ``--stop_after_seconds``; the schedule is
always the whole run's), `fit_epochs` (``model.fit``'s epochs) and `due` (an interval's end).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

import keras

from aetv2_tf.errors import UsageError
from aetv2_tf.files.safe_paths import write_atomically
from aetv2_tf.program import flag_support
from aetv2_tf.program.config import BUDGET_FILE, RunConfig, recorded_budget

#: Pairs at which the quickstart's quick KNN shows learning (docs/reproduction.md, "The
#: quickstart": 400 x 64 pairs gain +4.4 to +5.5 points over the random init, 68 x 64 about +1).
LEARNING_VISIBLE_PAIRS = 25_600


def total_steps(config: RunConfig, num_examples: int | None, images_per_step: int,
                train_steps: int = 0) -> tuple[int, int]:
    """(steps per epoch, total steps) from ``train_steps`` (`budget_steps`' count), else
    ``--train_steps``, else ``--epochs``; ``images_per_step``: the distinct training images a
    step consumes (AET: the batch, RotNet: a quarter of it)."""
    train_steps = train_steps or config.train.train_steps
    if num_examples is None and not train_steps:
        raise UsageError("the dataset size is unknown here: pass --train_steps.")
    per_epoch = max((num_examples or train_steps * images_per_step) // images_per_step, 1)
    steps = train_steps or config.train.epochs * per_epoch
    if steps > flag_support.MAX_INT:
        raise UsageError(f"--epochs={config.train.epochs} of {per_epoch} steps is {steps} steps, "
                         f"more than the {flag_support.MAX_INT} a run counts; pass fewer "
                         "--epochs.")
    return min(per_epoch, steps), steps


class StepTimes(keras.callbacks.Callback):
    """``(steps done, time.perf_counter())`` at the end of every execution of ``fit``."""

    def __init__(self):
        super().__init__()
        self.marks: list[tuple[int, float]] = []

    def on_train_batch_end(self, batch, logs=None):
        self.marks.append((int(batch) + 1, time.perf_counter()))


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def budget_steps(config: RunConfig,
                 fit_first_steps: Callable[[int, keras.callbacks.Callback], None],
                 writer: bool = True, executions: int = 5) -> int:
    """``--train_seconds``: the steps that fill that many seconds of training here.

    On a resume, the count recorded in ``<model_dir>/budget.json``; else measured:
    ``fit_first_steps(n, timer)`` trains a throwaway model for ``executions`` executions of
    ``--steps_per_execution`` steps; the rate of all but the first two (tracing, warm-up) sets
    the count, which ``writer`` (the chief) records. The run is then that of
    ``--train_steps=<count>``."""
    train, outputs = config.train, config.outputs
    path = os.path.join(outputs.model_dir, BUDGET_FILE)
    try:
        recorded = recorded_budget(config)
    except UsageError:
        if not outputs.overwrite:
            raise
        recorded = None  # --overwrite: another budget is measured anew
    if recorded:
        return int(recorded["train_steps"])
    timer = StepTimes()
    fit_first_steps(executions * train.steps_per_execution, timer)
    (s0, t0), (s1, t1) = timer.marks[1], timer.marks[-1]
    rate = (s1 - s0) / max(t1 - t0, 1e-9)  # steps per second
    steps = min(max(int(train.train_seconds * rate), 1), flag_support.MAX_INT)
    record = dict(train_seconds=train.train_seconds, train_steps=steps,
                  pairs_per_sec=round(rate * train.batch_size, 1), timed_steps=s1 - s0,
                  measured=time.strftime("%Y-%m-%d %H:%M:%S"))
    if writer:
        write_atomically(path, json.dumps(record, indent=1))
    print(f"Time budget --train_seconds={train.train_seconds:g}: {record['pairs_per_sec']} "
          f"pairs/s measured here -> --train_steps={steps} of {train.batch_size} pairs, about "
          f"{_duration(steps / rate)} of training (recorded in {path}).", flush=True)
    if outputs.quick_knn_train and steps * train.batch_size < LEARNING_VISIBLE_PAIRS:
        enough = 10 * -(-LEARNING_VISIBLE_PAIRS // (10 * record["pairs_per_sec"]))
        print(f"Note: {steps * train.batch_size:,} pairs are few for the quick KNN to show "
              f"learning (the quickstart gained about +1 point over the random init at 4,352 "
              f"pairs, +4.4 to +5.5 at {LEARNING_VISIBLE_PAIRS:,}: docs/reproduction.md); on "
              f"this machine --train_seconds={enough:.0f} trains {LEARNING_VISIBLE_PAIRS:,}.",
              flush=True)
    return steps


def stop_step(config: RunConfig, start: int, steps: int) -> int:
    """Where this invocation ends: ``steps``, or earlier by ``--stop_after_steps``."""
    after = config.train.stop_after_steps
    return min(steps, start + after) if after else steps


def deadline(config: RunConfig) -> float | None:
    """``--stop_after_seconds`` as a ``time.monotonic()`` deadline from `program.STARTED`; None
    when off."""
    from aetv2_tf.program import STARTED

    seconds = config.train.stop_after_seconds
    return STARTED + seconds if seconds else None


def fit_epochs(start: int, stop: int, per_epoch: int, steps_per_execution: int) -> dict:
    """``model.fit``'s epoch arguments for steps ``start .. stop - 1`` on data that ends there:
    epochs of a multiple of ``steps_per_execution`` steps (no execution straddles two epochs),
    numbered on from ``start``; only the last execution can be short."""
    size = -(-min(per_epoch, stop - start) // steps_per_execution) * steps_per_execution
    first = start // size
    return dict(steps_per_epoch=size, initial_epoch=first,
                epochs=first + -(-(stop - start) // size))


def due(step: int, previous: int, every: int) -> bool:
    """True when a multiple of `every` lies in `(previous, step]`: an interval of `every` steps
    ended since the previous batch end (also after a resume not aligned to executions)."""
    return every > 0 and step // every > previous // every
