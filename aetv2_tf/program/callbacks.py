"""Keras callbacks of the training program: checkpoints, interruption, stops (what a run shows,
its progress bar and TensorBoard summaries, is `program.monitoring`).

Only the chief writes checkpoints and summaries. Checkpoints go to a `CheckpointStore`
(`keras_checkpoints.KerasCheckpoints`: Keras `.weights.h5` files, each written under a temporary
name and renamed into place, so a listed checkpoint is always whole). TensorFlow is imported only
by what needs it (finiteness checks of distributed variables): the callbacks serve both adapters.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import keras
import numpy as np
from absl import logging


def all_finite(variables) -> bool:
    """True when every variable is free of NaN and inf (read to the host: call rarely). Under
    TensorFlow through TensorFlow ops (distributed variables included)."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return all(bool(tf.reduce_all(tf.math.is_finite(tf.cast(v, tf.float32))))
                   for v in variables)
    return all(np.isfinite(keras.ops.convert_to_numpy(v).astype(np.float32)).all()
               for v in variables)


def due(step: int, previous: int, every: int) -> bool:
    """True when a multiple of `every` lies in `(previous, step]`: an interval of `every` steps
    ended since the previous batch end (`step % every == 0` would miss it after a resume that is
    not aligned to `steps_per_execution`: stops are exact, executions are not)."""
    return every > 0 and step // every > previous // every


class StepCounter(keras.callbacks.Callback):
    """The step of every backend: the number of batches consumed so far, counted in Python from
    `start` (reading a device counter every step would wait for the device) and capped at `stop`
    (the data ends there, so a last execution of `steps_per_execution` can be short). It names
    checkpoints and fixes the data position on resume; a skipped (non-finite) step counts, as
    its batch was consumed. Fit with `program.fit_epochs`. Call it for the current step."""

    def __init__(self, start: int, stop: int):
        super().__init__()
        self.step = self._epoch_start = int(start)
        self.stop = int(stop)

    def __call__(self) -> int:
        return self.step

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self.step

    def on_train_batch_end(self, batch, logs=None):
        self.step = min(self._epoch_start + int(batch) + 1, self.stop)


class CheckpointStore:
    """Where `CheckpointEvery` saves: the step of the newest checkpoint, a save, and setting a
    checkpoint aside (its weights are not to be resumed from)."""

    def latest_step(self) -> int | None:
        raise NotImplementedError

    def save(self, model: keras.Model, step: int) -> str:
        raise NotImplementedError

    def set_aside(self, step: int, reason: str) -> None:
        """Renames the checkpoint of `step`, if there is one, out of the listing (never deletes
        it), saying `reason`."""
        raise NotImplementedError


class CheckpointEvery(keras.callbacks.Callback):
    """Saves a checkpoint every `every` steps (`step_fn()`: batches consumed) and when training
    ends, into `store` (a `CheckpointStore`: `keras_checkpoints.KerasCheckpoints` on every
    backend).

    A checkpoint is written only if every model weight is finite: a non-finite model stops the run
    (`refused` is then True) and the last good checkpoint stays the newest one; after `hold`
    (a diverging loss, `StopOnLossGrowth`) none is written any more.
    """

    def __init__(self, store: CheckpointStore, step_fn, every: int, writer: bool = True):
        super().__init__()
        self.store = store
        self.step_fn, self.every, self.writer = step_fn, every, writer
        self._last = None
        self._previous = 0
        self.refused = self.held = False

    def hold(self) -> None:
        """Writes no checkpoint from now on: the weights are not to be kept."""
        self.held = True

    def newest(self) -> str:
        """The newest checkpoint, in words: "the one of step N", or that there is none."""
        latest = self.store.latest_step()
        return "no checkpoint was written yet" if latest is None else \
            f"the newest checkpoint stays the one of step {latest}"

    def save(self) -> str | None:
        step = self.step_fn()
        if self.held or step in (self._last, self.store.latest_step()):
            return None
        model = self.model  # under JAX this syncs the jitted state into the variables
        if not all_finite(model.weights):
            logging.error("Non-finite weights at step %d: checkpoint NOT written; %s.", step,
                          self.newest())
            model.stop_training = self.refused = True
            self._last = step  # not again at the end of training
            return None
        WRITING.set()  # a second signal now waits for the checkpoint (StopOnSignal)
        try:
            path = self.store.save(model, step)
        finally:
            WRITING.clear()
        self._last = step
        if self.writer:
            logging.info("Saved checkpoint %s (step %d).", path, step)
        return path

    def on_train_begin(self, logs=None):
        self._previous = self.step_fn()

    def on_train_batch_end(self, batch, logs=None):
        step = self.step_fn()
        previous, self._previous = self._previous, step
        if due(step, previous, self.every):
            self.save()

    def on_train_end(self, logs=None):
        self.save()


#: Set while `CheckpointEvery` writes a checkpoint.
WRITING = threading.Event()


class StopOnSignal(keras.callbacks.Callback):
    """Turns SIGTERM/SIGINT into a clean stop at the end of the current step.

    Training then ends normally, so `CheckpointEvery.on_train_end` writes a final checkpoint
    (put this callback AFTER `CheckpointEvery`: its handlers stay until that checkpoint is
    written). A second signal kills at once with the previous behaviour (an impatient Ctrl-C
    twice), except while a checkpoint is being written: then the run stops once it is complete.
    `agree` (several workers: `distribute.signal_agreement`) sums every worker's received
    signals after each step, so that all stop after the same step when one is signalled: only
    the sums decide, never a signal that arrived after this worker's count was sent.
    """

    def __init__(self, agree=None):
        super().__init__()
        self.received = None
        self.agree = agree
        self._previous = {}

    def _handler(self, signum, frame):
        name = signal.Signals(signum).name
        if self.received is None:
            self.received = name
            logging.warning("%s received: stopping after this step and writing a checkpoint.",
                            name)
            return
        if WRITING.is_set():
            logging.warning("%s received while a checkpoint is written: stopping once it is "
                            "complete.", name)
            return
        for sig, prev in self._previous.items():  # the impatient second signal: act as before
            signal.signal(sig, prev)
        self._previous = {}
        os.kill(os.getpid(), signum)

    def on_train_begin(self, logs=None):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handler)

    def on_train_batch_end(self, batch, logs=None):
        if self.agree is None:
            if self.received:
                self.model.stop_training = True
            return
        # Several workers: only the agreed sums decide. The handler may run while `agree` waits
        # for the other workers, after this worker's count was sent: that signal is sent after
        # the next step, and every worker stops then.
        sent = self.received
        sigint, sigterm = self.agree(int(sent == "SIGINT"), int(sent == "SIGTERM"))
        if not (sigint or sigterm):
            return
        if self.received is None:
            self.received = "SIGTERM" if sigterm else "SIGINT"
            logging.warning("Another worker received %s: stopping after this step and "
                            "writing a checkpoint.", self.received)
        self.model.stop_training = True

    def on_train_end(self, logs=None):
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)
        self._previous = {}


class StopOnSkippedStep(keras.callbacks.Callback):
    """Logs every skipped (non-finite) step; with `stop=True`, ends training at the first one.

    With `stop=False` (skip), training still ends after `patience` skipped steps in a row: the
    model has diverged (e.g. non-finite weights or BatchNorm statistics make every step
    non-finite), and skipping would otherwise spin until the end of the run doing nothing.
    The optimizer's `skipped_steps` is read every `every` steps (`step_fn()`: the step); under
    JAX a read first syncs the jitted state into the variables, which waits for the device.
    """

    def __init__(self, optimizer, step_fn, stop: bool, patience: int = 10, every: int = 1):
        super().__init__()
        self.optimizer, self.step_fn, self.stop, self.patience = optimizer, step_fn, stop, patience
        self.every = every
        self._seen = self._in_a_row = self._previous = 0
        self.diverged = self.stopped = False

    def _skipped(self) -> int | None:
        counter = getattr(self.optimizer, "skipped_steps", None)
        if counter is None:
            return None
        self.model  # noqa: B018 - the property syncs a JAX model's state into its variables
        return int(keras.ops.convert_to_numpy(counter.value))

    def on_train_begin(self, logs=None):
        # A resumed optimizer holds the skips of the earlier invocations: only new ones count.
        self._seen, self._previous = self._skipped() or 0, self.step_fn()

    def on_train_batch_end(self, batch, logs=None):
        step, previous = self.step_fn(), self._previous
        if not due(step, previous, self.every):
            return
        self._previous = step
        skipped = self._skipped()
        if skipped is None:
            return
        since = step - previous
        if skipped == self._seen:
            self._in_a_row = 0
            return
        new = skipped - self._seen
        self._in_a_row = self._in_a_row + new if new >= since else new
        logging.error("Non-finite loss or gradient: %d step(s) skipped by step %d "
                      "(total skipped: %d).", new, step, skipped)
        self._seen = skipped
        if self.stop:
            logging.error("--on_nonfinite=stop: ending training; no update was applied.")
            self.stopped = True
            self.model.stop_training = True
        elif self._in_a_row >= self.patience:
            logging.error("%d steps in a row were non-finite by step %d: the model has "
                          "diverged; ending training (lower --learning_rate, add "
                          "--warmup_steps, or resume from an earlier checkpoint).",
                          self._in_a_row, step)
            self.diverged = True
            self.model.stop_training = True


class StepTimes(keras.callbacks.Callback):
    """``(steps done, time.perf_counter())`` at the end of every execution of ``fit``."""

    def __init__(self):
        super().__init__()
        self.marks: list[tuple[int, float]] = []

    def on_train_batch_end(self, batch, logs=None):
        self.marks.append((int(batch) + 1, time.perf_counter()))


class StopAtStep(keras.callbacks.Callback):
    """Ends ``fit`` at exactly ``steps`` steps (epochs may be offset after a resume);
    ``step_fn()`` is the number of batches consumed."""

    def __init__(self, steps: int, step_fn):
        super().__init__()
        self.steps, self.step_fn = steps, step_fn

    def on_train_batch_end(self, batch, logs=None):
        if self.step_fn() >= self.steps:
            self.model.stop_training = True


class StopAtDeadline(keras.callbacks.Callback):
    """Ends ``fit`` after the step (execution) during which ``clock()`` reached ``deadline``;
    the checkpoint saver then writes the step reached (`CheckpointEvery.on_train_end`).
    ``reached``: whether it did."""

    def __init__(self, deadline: float, clock=time.monotonic):
        super().__init__()
        self.deadline, self.clock = deadline, clock
        self.reached = False

    def on_train_batch_end(self, batch, logs=None):
        if self.clock() >= self.deadline:
            self.reached = self.model.stop_training = True
