"""What a training run shows while it runs: the progress bar, and the scalars and image pairs
for TensorBoard and train/log.csv (the loss and its terms first, `metrics.shown_order`).
"""

from __future__ import annotations

import time

import keras
import numpy as np

from aetv2_tf.method.metrics import shown_order
from aetv2_tf.models.displayed_loss import ShownOrderBar
from aetv2_tf.program.run_length import due


class ProgressBar(ShownOrderBar):
    """`ShownOrderBar` that ends an epoch left early at the step reached: partly drawn while
    ``finished()`` is False (the run goes on when rerun), full at that count when True."""

    def __init__(self, finished):
        super().__init__()
        self.finished = finished

    def on_epoch_end(self, epoch, logs=None):
        if self.progbar is not None and self.model.stop_training and 0 < self.seen:
            if self.finished():
                self.progbar.target = self.seen
            logs = {k: logs[k] for k in shown_order(logs or {})}
            self.progbar.update(self.seen, list(logs.items()), finalize=True)
            return
        super().on_epoch_end(epoch, logs)


class TensorBoardLog:
    """A run's scalars and images as TensorBoard events in ``log_dir`` (TensorFlow)."""

    def __init__(self, log_dir: str):
        import tensorflow as tf

        self.writer = tf.summary.create_file_writer(log_dir)

    def scalars(self, step: int, row: dict[str, float]) -> None:
        import tensorflow as tf

        with self.writer.as_default(step=step):
            for name, value in row.items():
                tf.summary.scalar(name, value)
        self.writer.flush()

    def images(self, step: int, name: str, grid: np.ndarray) -> None:
        import tensorflow as tf

        with self.writer.as_default(step=step):
            tf.summary.image(name, grid, max_outputs=len(grid))
        self.writer.flush()

    def flush(self) -> None:
        self.writer.flush()


class CsvScalars:
    """A run's scalars as the rows of a CSV file at ``path`` (`scalar_logs.CsvLog`)."""

    def __init__(self, path: str):
        self.path = path
        self.log = None

    def scalars(self, step: int, row: dict[str, float]) -> None:
        from aetv2_tf.files.scalar_logs import CsvLog

        if self.log is None:
            self.log = CsvLog(self.path, tuple(row))
        self.log.write(step, row)

    def images(self, step: int, name: str, grid: np.ndarray) -> None:
        """Nothing: a CSV holds scalars only."""

    def flush(self) -> None:
        """Nothing: rows are written as they come."""


def model_prediction(model: keras.Model, inputs) -> np.ndarray:
    """The decoded parameters (B, 8) of ``inputs``: a direct call (predict_on_batch would
    gather across workers while only the chief draws)."""
    output = model(inputs, training=False)
    return keras.ops.convert_to_numpy(keras.ops.cast(output, "float32"))


class PretextSummaries(keras.callbacks.Callback):
    """Scalars every ``every`` steps and (x, t(x)) image pairs every ``image_every`` steps, into
    each of ``logs`` (`TensorBoardLog`, `CsvScalars`).

    Scalars: the model's metrics in `metrics.shown_order` (means since the previous summary),
    then `learning_rate` (``lr_fn(step)``) and `pairs_per_sec`. Images `pairs`: x beside t(x),
    the true (green) and predicted (red) corner quadrilaterals drawn by ``draw_fn``.
    ``sample``: ``((x, tx), params)`` normalised pairs, or ``((x, tx), params, inputs)`` where
    the model takes other inputs; None: no images. ``step_fn()``: the step reached.
    """

    def __init__(self, logs: list, step_fn, lr_fn, every: int, image_every: int,
                 global_batch: int, sample=None, draw_fn=None, predict=model_prediction):
        super().__init__()
        self.logs = logs
        self.step_fn, self.lr_fn = step_fn, lr_fn
        self.every, self.image_every, self.global_batch = every, image_every, global_batch
        self.sample, self.draw_fn, self.predict = sample, draw_fn, predict
        self._t0 = self._s0 = None
        self._previous = self._seen = 0
        self._sums: dict[str, float] = {}

    def on_train_begin(self, logs=None):
        self._t0, self._s0 = time.perf_counter(), self.step_fn()
        self._previous = self._s0
        if self.sample is not None and self._s0 == 0:
            self._images(0)

    def on_epoch_begin(self, epoch, logs=None):
        self._seen, self._sums = 0, {}

    def on_train_batch_end(self, batch, logs=None):
        step = self.step_fn()
        previous, self._previous = self._previous, step
        if due(step, previous, self.every):
            self._scalars(step, self._interval_means(batch + 1, logs or {}))
        if self.sample is not None and due(step, previous, self.image_every):
            self._images(step)

    def on_train_end(self, logs=None):
        for log in self.logs:
            log.flush()

    def _interval_means(self, seen: int, logs: dict) -> dict:
        """Means over the batches since the last summary, from running means over the epoch."""
        means = {}
        for name in shown_order(logs):
            total = float(logs[name]) * seen
            means[name] = (total - self._sums.get(name, 0.0)) / max(seen - self._seen, 1)
            self._sums[name] = total
        self._seen = seen
        return means

    def _scalars(self, step: int, logs: dict) -> None:
        now = time.perf_counter()
        rate = (step - self._s0) * self.global_batch / max(now - self._t0, 1e-9)
        self._t0, self._s0 = now, step
        row = {name: float(value) for name, value in logs.items()}
        row.update(learning_rate=float(self.lr_fn(step)), pairs_per_sec=rate)
        for log in self.logs:
            log.scalars(step, row)

    def _images(self, step: int) -> None:
        (x, tx), params, *model_inputs = self.sample  # the model's own inputs, if not (x, tx)
        predicted = self.predict(self.model, model_inputs[0] if model_inputs else (x, tx))
        grid = self.draw_fn(x, tx, np.asarray(params), predicted)
        for log in self.logs:
            log.images(step, "pairs", grid)
