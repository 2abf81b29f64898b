"""The checkpoints of a training run: saved every N steps and when training ends, only for
finite weights (`CheckpointSaver`, applied by `run_control.RunControl`), into a
`CheckpointStore` (`keras_checkpoints.KerasCheckpoints`). Any backend: TensorFlow is imported
only for the finiteness of distributed variables.
"""

from __future__ import annotations

import threading
from typing import Protocol

import keras
import numpy as np
from absl import logging


class CheckpointStore(Protocol):
    """Where a `CheckpointSaver` saves: the step of the newest checkpoint, a save, and setting
    a checkpoint aside (its weights are not to be resumed from)."""

    def latest_step(self) -> int | None: ...

    def save(self, model: keras.Model, step: int) -> str: ...

    def set_aside(self, step: int, reason: str) -> None:
        """Renames the checkpoint of ``step``, if there is one, out of the listing (never
        deletes it), saying ``reason``."""


def all_finite(variables) -> bool:
    """True when every variable is free of NaN and inf (read to the host: call rarely);
    distributed variables included."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return all(bool(tf.reduce_all(tf.math.is_finite(tf.cast(v, tf.float32))))
                   for v in variables)
    return all(np.isfinite(keras.ops.convert_to_numpy(v).astype(np.float32)).all()
               for v in variables)


class CheckpointSaver:
    """Saves a checkpoint of the step reached into ``store`` every ``every`` steps and when
    training ends, only if every model weight is finite (else ``refused`` is set: training is
    to stop); after `hold` none is written. ``writing`` is set while a checkpoint is written;
    ``writer``: this worker's saves are the run's (it logs them)."""

    def __init__(self, store: CheckpointStore, every: int, writer: bool = True):
        self.store, self.every, self.writer = store, every, writer
        self.writing = threading.Event()
        self.refused = self.held = False
        self._last: int | None = None

    def hold(self) -> None:
        """Writes no checkpoint from now on: the weights are not to be kept."""
        self.held = True

    def newest(self) -> str:
        """The newest checkpoint, in words: "the one of step N", or that there is none."""
        latest = self.store.latest_step()
        return "no checkpoint was written yet" if latest is None else \
            f"the newest checkpoint stays the one of step {latest}"

    def save(self, model: keras.Model, step: int) -> str | None:
        """The checkpoint of ``step`` (``model``'s weights and optimizer), unless held, already
        written, or refused for non-finite weights; its path, or None."""
        if self.held or step in (self._last, self.store.latest_step()):
            return None
        self._last = step  # a refused step is not tried again at the end of training
        if not all_finite(model.weights):
            logging.error("Non-finite weights at step %d: checkpoint NOT written; %s.", step,
                          self.newest())
            self.refused = True
            return None
        self.writing.set()
        try:
            path = self.store.save(model, step)
        finally:
            self.writing.clear()
        if self.writer:
            logging.info("Saved checkpoint %s (step %d).", path, step)
        return path
