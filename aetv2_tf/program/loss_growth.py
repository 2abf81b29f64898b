"""The stop of a finite divergence: a loss that grew past `--max_loss_growth` times its first
logged value (a run at `--learning_rate=1e6` ended "successfully" at a loss of 7e13), the last
good checkpoint kept. Non-finite steps are `callbacks.StopOnSkippedStep`'s."""

from __future__ import annotations

import keras
import numpy as np
from absl import logging

from aetv2_tf.method.metrics import PENALTY
from aetv2_tf.program.callbacks import CheckpointEvery


class StopOnLossGrowth(keras.callbacks.Callback):
    """Ends training when the loss of the steps since the previous batch end (recovered from
    Keras's running means over the epoch: the loss the optimiser minimises, ``logs["loss"]``
    plus the weight decay shown apart, ``logs["l2_penalty"]``) grows past `factor` times the first
    such value of this invocation: a finite divergence (non-finite steps are
    `StopOnSkippedStep`'s). The `saver` (`CheckpointEvery`, put AFTER this callback) writes no
    checkpoint from then on, and the checkpoint of the previous batch end, whose weights gave
    the grown loss, is set aside (`CheckpointStore.set_aside`: renamed, never deleted): the
    newest is the last good one. `grew` says where and by how much. `factor` 0: off."""

    def __init__(self, saver: CheckpointEvery, step_fn, factor: float):
        super().__init__()
        self.saver, self.step_fn, self.factor = saver, step_fn, factor
        self.first: float | None = None
        self.grew: str | None = None
        self._step = self._seen = 0
        self._total = 0.0

    def on_train_begin(self, logs=None):
        self._step = self.step_fn()

    def on_epoch_begin(self, epoch, logs=None):
        self._seen, self._total = 0, 0.0

    def on_train_batch_end(self, batch, logs=None):
        logs = logs or {}
        mean, previous, self._step = logs.get("loss"), self._step, self.step_fn()
        if not self.factor or mean is None or self.grew:
            return
        mean = float(mean) + float(logs.get(PENALTY, 0.0))  # (`models.displayed_loss`)
        seen, total = int(batch) + 1, float(mean) * (int(batch) + 1)
        loss = (total - self._total) / max(seen - self._seen, 1)
        self._seen, self._total = seen, total
        if not np.isfinite(loss):
            return
        if self.first is None:
            self.first = loss
        elif self.first > 0 and loss > self.factor * self.first:
            self.grew = (f"{loss:.4g} at step {self._step}, {loss / self.first:.3g} times its "
                         f"first logged value {self.first:.4g}")
            self.saver.hold()
            self.saver.store.set_aside(previous, f"its weights gave the loss {loss:.4g}, "
                                                 f"over {self.factor:g} times the first "
                                                 f"{self.first:.4g}")
            logging.error("The loss grew to %s (--max_loss_growth=%g): training diverged; "
                          "ending training without a checkpoint of these weights; %s.",
                          self.grew, self.factor, self.saver.newest())
            self.model.stop_training = True
