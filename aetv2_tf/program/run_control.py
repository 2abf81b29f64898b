"""What decides, step by step, how a pretraining's ``fit`` goes on and how it ended.

`RunControl` is the one Keras callback of the training loop (`pretext_stage.train`) that
counts the steps and stops and saves: after every batch end, in this order, it

1. counts the step (batches consumed: the data position and the checkpoint's name);
2. reads the optimizer's skipped steps, when due (`divergence.NonFiniteSteps`);
3. stops at this invocation's last step (``--stop_after_steps``, or the run's end) or at its
   deadline (``--stop_after_seconds``);
4. checks the loss growth (`divergence.LossGrowth`), before any save: the weights whose loss
   grew are never saved, and the checkpoint that gave that loss is set aside;
5. saves a checkpoint when due (`checkpoint_saver.CheckpointSaver`; non-finite weights stop
   the run instead, and so do trainable weights that still hold the values of this
   invocation's start, ``watch_weights``: nothing was learned, nothing is saved from then on);
6. stops on a signal (`signal_stop.SignalStop`, agreed among workers).

When training ends it saves the final checkpoint (the weights checked again), then puts the
signal handlers back (a second signal during that save waits for it). `outcome` is how it
ended: an `Outcome`, whose `Ending` the program turns into its last lines and exit code
(`aetv2_tf.train`).
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import keras
from absl import logging

from aetv2_tf.files.digests import weights_digest
from aetv2_tf.program.checkpoint_saver import CheckpointSaver
from aetv2_tf.program.divergence import LossGrowth, NonFiniteSteps, skipped_steps
from aetv2_tf.program.run_length import due
from aetv2_tf.program.signal_stop import SignalStop

#: Why steps leave every trainable weight as it was, with the fixes (exit 8).
UNCHANGED_WEIGHTS = (
    "changed no trainable weight: a learning rate that rounds to 0 against the weights (raise "
    "--learning_rate), an Adam --adam_beta2 of 1 (its steps are then 0: use 0.999), frozen "
    "layers (no trainable weight that the loss reaches), or every step skipped as non-finite "
    "(check the data)")


def values_digest(model: keras.Model) -> str:
    """`weights_digest` of ``model``'s trainable weights as values: -0.0 as 0.0 (a step of 0
    turns a 0.0 into -0.0, a change of bits, not of value)."""
    return weights_digest(w + 0 for w in model.trainable_weights)


class NothingLearned(Exception):
    """A classifier's epochs changed no trainable weight (exit 8, as `Ending.NOTHING_LEARNED`)."""


class Ending(enum.Enum):
    """How training ended, the first that applies in this order deciding the exit code."""

    SIGNAL = "stopped by a signal"                         # exit 128 + N
    DIVERGED = "every step non-finite"                     # exit 3
    NONFINITE_WEIGHTS = "non-finite weights"               # exit 3
    LOSS_GREW = "the loss grew past --max_loss_growth"     # exit 7
    NONFINITE_STEP = "a non-finite step, --on_nonfinite=stop"  # exit 3
    NOTHING_LEARNED = "steps ran, no trainable weight changed"  # exit 8
    STOP_AFTER_SECONDS = "--stop_after_seconds"            # exit 0, the run goes on when rerun
    STOP_AFTER_STEPS = "--stop_after_steps"                # exit 0, the run goes on when rerun
    COMPLETED = "every step of the run"                    # exit 0


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a pretraining invocation ended: at ``step`` (batches consumed) of the run's
    ``steps``, and what happened on the way: the ``signal`` received (its name), steps
    non-finite in a row (``diverged``), a non-finite step under ``--on_nonfinite=stop``
    (``nonfinite_step``), a checkpoint refused for ``nonfinite_weights``, the loss growth
    (``loss_grew``: where and by how much), the trainable weights ``unchanged`` by the steps
    that ran, the ``deadline`` reached."""

    step: int
    steps: int
    signal: str | None = None
    diverged: bool = False
    nonfinite_step: bool = False
    nonfinite_weights: bool = False
    loss_grew: str | None = None
    unchanged: bool = False
    deadline: bool = False

    @property
    def ending(self) -> Ending:
        for ending, happened in ((Ending.SIGNAL, self.signal), (Ending.DIVERGED, self.diverged),
                                 (Ending.NONFINITE_WEIGHTS, self.nonfinite_weights),
                                 (Ending.LOSS_GREW, self.loss_grew),
                                 (Ending.NONFINITE_STEP, self.nonfinite_step),
                                 (Ending.NOTHING_LEARNED, self.unchanged)):
            if happened:
                return ending
        if self.step >= self.steps:
            return Ending.COMPLETED
        return Ending.STOP_AFTER_SECONDS if self.deadline else Ending.STOP_AFTER_STEPS

    @property
    def finished(self) -> bool:
        """Every step of the run trained cleanly: the encoder is then written and exported."""
        return self.ending is Ending.COMPLETED

    def entries(self) -> dict[str, Any]:
        """What the summary line shows of it, besides the steps (``k=v`` entries)."""
        shown = dict(stopped_at_deadline=self.deadline,
                     interrupted_by=self.signal, diverged=self.diverged,
                     stopped_nonfinite=self.nonfinite_step,
                     nonfinite_weights=self.nonfinite_weights, loss_grew=self.loss_grew,
                     unchanged_weights=self.unchanged)
        return {key: value for key, value in shown.items() if value}


class StageResult(NamedTuple):
    """What a stage returns to `aetv2_tf.train`: ``summary``, the entries of its last line;
    for a pretraining that trained, its ``outcome`` (None: a probe or supervised stage);
    ``finished_before``: the run had finished all its steps before (nothing was done);
    ``export_failed``: training finished but the SavedModel export failed (exit 4)."""

    summary: dict[str, Any]
    outcome: Outcome | None = None
    finished_before: bool = False
    export_failed: bool = False


class RunControl(keras.callbacks.Callback):
    """The stops and saves of a pretraining's ``fit`` (module docstring), from step ``start``
    to ``stop`` (capped there: the data ends, so a last execution of ``steps_per_execution``
    can be short) of a run of ``steps``. ``step``: the batches consumed so far, counted in
    Python (reading a device counter every step would wait for the device); a skipped step
    counts, as its batch was consumed. Fit with `run_length.fit_epochs`. The parts a test
    leaves out (None, False) are not watched."""

    def __init__(self, start: int, stop: int, steps: int, *,
                 saver: CheckpointSaver | None = None, nonfinite: NonFiniteSteps | None = None,
                 growth: LossGrowth | None = None, signals: SignalStop | None = None,
                 deadline: float | None = None, clock: Callable[[], float] = time.monotonic,
                 watch_weights: bool = False):
        super().__init__()
        self.step = self._epoch_start = self.start = int(start)
        self.stop, self.steps = int(stop), int(steps)
        self.saver, self.nonfinite, self.growth = saver, nonfinite, growth
        self.signals, self.deadline, self.clock = signals, deadline, clock
        self.deadline_reached = self.unchanged = False
        self.watch_weights, self._start_digest = watch_weights, None
        if saver is not None and signals is not None:
            signals.writing = saver.writing  # a second signal waits for a checkpoint

    def outcome(self) -> Outcome:
        return Outcome(
            self.step, self.steps, signal=self.signals and self.signals.received,
            diverged=bool(self.nonfinite and self.nonfinite.diverged),
            nonfinite_step=bool(self.nonfinite and self.nonfinite.stopped),
            nonfinite_weights=bool(self.saver and self.saver.refused),
            loss_grew=self.growth and self.growth.grew, unchanged=self.unchanged,
            deadline=self.deadline_reached)

    def on_train_begin(self, logs=None):
        self._start_digest = values_digest(self.model) if self.watch_weights else None
        if self.nonfinite is not None:
            self.nonfinite.begin(self.step, self._skipped())
        if self.signals is not None:
            self.signals.install()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self.step
        if self.growth is not None:
            self.growth.begin_epoch()

    def on_train_batch_end(self, batch, logs=None):
        previous, self.step = self.step, min(self._epoch_start + int(batch) + 1, self.stop)
        stop = self.step >= self.stop
        if self.nonfinite is not None and self.nonfinite.due(self.step):
            stop |= self.nonfinite.count(self.step, self._skipped())
        if self.deadline is not None and self.clock() >= self.deadline:
            stop = self.deadline_reached = True
        if self.growth is not None and self.growth.grows(batch, logs or {}, self.step):
            self._hold_checkpoints(previous)
            stop = True
        if self.saver is not None and due(self.step, previous, self.saver.every):
            stop |= self._learned_nothing()
            self.saver.save(self.model, self.step)
            stop |= self.saver.refused
        if self.signals is not None:
            stop |= self.signals.stops()
        if stop:
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        try:
            self._learned_nothing()
            if self.saver is not None:
                self.saver.save(self.model, self.step)
        finally:
            self.close()

    def close(self) -> None:
        """Puts the signal handlers back (once training has ended, however it ended)."""
        if self.signals is not None:
            self.signals.restore()

    def _learned_nothing(self) -> bool:
        """Whether steps ran and the trainable weights still hold the values of the start
        (then no checkpoint is written from now on: a rerun starts from the same weights);
        once they changed, they are not read again."""
        if self._start_digest is None or self.step == self.start:
            return False
        if values_digest(self.model) != self._start_digest:
            self._start_digest = None
            return False
        self.unchanged = True
        if self.saver is not None:
            self.saver.hold()
        return True

    def _skipped(self) -> int | None:
        return skipped_steps(self.model.optimizer)  # `model` syncs a JAX model's state

    def _hold_checkpoints(self, previous: int) -> None:
        """The loss grew: no checkpoint from now on, and the one of the previous batch end,
        whose weights gave that loss, is set aside (renamed, never deleted)."""
        growth = self.growth
        if self.saver is not None:
            self.saver.hold()
            self.saver.store.set_aside(previous, growth.aside)
        newest = self.saver.newest() if self.saver is not None else "no checkpoint is kept"
        logging.error("The loss grew to %s (--max_loss_growth=%g): training diverged; ending "
                      "training without a checkpoint of these weights; %s.", growth.grew,
                      growth.factor, newest)
