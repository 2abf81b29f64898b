"""The two ways a training run diverges, watched by `run_control.RunControl` after each step:
non-finite steps (`NonFiniteSteps`: skipped by the optimizer, counted in its ``skipped_steps``)
and a finite divergence (`LossGrowth`: a loss past ``--max_loss_growth`` times its first logged
value)."""

from __future__ import annotations

import keras
import numpy as np
from absl import logging

from aetv2_tf.method.metrics import PENALTY
from aetv2_tf.program.run_length import due


def skipped_steps(optimizer) -> int | None:
    """The optimizer's count of skipped (non-finite) steps, read to the host; None for an
    optimizer that counts none (`method.optimizers.SkipNonFinite` does)."""
    counter = getattr(optimizer, "skipped_steps", None)
    return None if counter is None else int(keras.ops.convert_to_numpy(counter.value))


class NonFiniteSteps:
    """Logs every skipped (non-finite) step; with ``stop``, training ends at the first one
    (``stopped``), else after ``patience`` skipped steps in a row (``diverged``: every step is
    then non-finite). The counter is read every ``every`` steps; only skips after `begin`
    count."""

    def __init__(self, stop: bool, patience: int = 10, every: int = 1):
        self.stop, self.patience, self.every = stop, patience, every
        self.stopped = self.diverged = False
        self._seen = self._in_a_row = self._previous = 0

    def begin(self, step: int, skipped: int | None) -> None:
        self._previous, self._seen = step, skipped or 0

    def due(self, step: int) -> bool:
        return due(step, self._previous, self.every)

    def count(self, step: int, skipped: int | None) -> bool:
        """After the due check of ``step`` with the counter's value ``skipped``: whether
        training ends now."""
        previous, self._previous = self._previous, step
        if skipped is None:
            return False
        if skipped == self._seen:
            self._in_a_row = 0
            return False
        new = skipped - self._seen
        self._in_a_row = self._in_a_row + new if new >= step - previous else new
        self._seen = skipped
        logging.error("Non-finite loss or gradient: %d step(s) skipped by step %d "
                      "(total skipped: %d).", new, step, skipped)
        if self.stop:
            logging.error("--on_nonfinite=stop: ending training; no update was applied.")
            self.stopped = True
        elif self._in_a_row >= self.patience:
            logging.error("%d steps in a row were non-finite by step %d: the model has "
                          "diverged; ending training (lower --learning_rate, add "
                          "--warmup_steps, or resume from an earlier checkpoint).",
                          self._in_a_row, step)
            self.diverged = True
        return self.stopped or self.diverged


class LossGrowth:
    """Whether the mean loss of the steps since the previous batch end (from Keras's running
    epoch means of ``logs["loss"]`` plus ``logs["l2_penalty"]``) grew past ``factor`` times the
    first such value of this invocation; ``factor`` 0: never. ``grew`` says where and by how
    much, ``aside`` why the checkpoint that gave that loss is set aside."""

    def __init__(self, factor: float):
        self.factor = factor
        self.first: float | None = None
        self.grew: str | None = None
        self.aside: str | None = None
        self._seen, self._total = 0, 0.0

    def begin_epoch(self) -> None:
        self._seen, self._total = 0, 0.0

    def grows(self, batch: int, logs: dict, step: int) -> bool:
        """After batch ``batch`` of the epoch (``logs``: Keras's), which ended at ``step``:
        whether the loss grew past the bound now."""
        mean = logs.get("loss")
        if not self.factor or mean is None or self.grew:
            return False
        mean = float(mean) + float(logs.get(PENALTY, 0.0))  # (`models.displayed_loss`)
        seen, total = int(batch) + 1, mean * (int(batch) + 1)
        loss = (total - self._total) / max(seen - self._seen, 1)
        self._seen, self._total = seen, total
        if not np.isfinite(loss):
            return False
        if self.first is None:
            self.first = loss
            return False
        if self.first <= 0 or loss <= self.factor * self.first:
            return False
        self.grew = (f"{loss:.4g} at step {step}, {loss / self.first:.3g} times its first "
                     f"logged value {self.first:.4g}")
        self.aside = (f"its weights gave the loss {loss:.4g}, over {self.factor:g} times the "
                      f"first {self.first:.4g}")
        return True
