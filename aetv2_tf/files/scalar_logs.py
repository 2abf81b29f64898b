"""Scalar logs on every Keras backend: a CSV always (`CsvLog`), TensorBoard events where
TensorFlow is there (`tensorboard_writer`, `write_scalars`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

from aetv2_tf.files.safe_paths import open_for_writing


class CsvLog:
    """Appends ``step,<columns>`` rows to ``path``; a missing column is an empty cell. ``fresh``
    starts the file anew, else rows go under the file's own header (its columns win; a value
    without one is left out); never through a symbolic link (`safe_paths.open_for_writing`)."""

    def __init__(self, path: str, columns: Sequence[str], step_name: str = "step",
                 fresh: bool = False):
        self.path, self.columns = path, tuple(columns)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        if fresh or not os.path.lexists(path):
            with open_for_writing(path, "w") as f:
                f.write(",".join((step_name, *self.columns)) + "\n")
            return
        if os.path.islink(path) or not os.path.isfile(path):
            return  # not read: the writes refuse it (`open_for_writing`)
        with open(path) as f:
            header = f.readline(100_000).strip().split(",")  # a line of column names
        if len(header) > 1 and header[0] == step_name:
            self.columns = tuple(header[1:])

    def write(self, step: int, row: dict[str, float]) -> None:
        cells = [f"{float(row[c]):.6g}" if c in row else "" for c in self.columns]
        with open_for_writing(self.path, "a") as f:
            f.write(",".join([str(int(step)), *cells]) + "\n")

    def flush(self) -> None:
        """Rows are written as they come (the interface of a ``tf.summary`` writer)."""


def tensorboard_writer(log_dir: str) -> Any | None:
    """``tf.summary.create_file_writer(log_dir)``, or None where TensorFlow is not importable."""
    try:
        import tensorflow as tf
    except Exception:  # noqa: BLE001 - absent, blocked or broken: all mean "not here"
        return None
    import keras

    if keras.backend.backend() != "tensorflow":  # the accelerator's memory is the backend's
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError:  # TensorFlow already initialised its devices: leave them
            pass
    return tf.summary.create_file_writer(log_dir)


@functools.cache
def _scalar_metadata():
    from tensorflow.core.framework import summary_pb2

    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))


def write_scalar(name: str, value: float, step: int) -> None:
    """A float32 scalar tagged for TensorBoard's "scalars" plugin, into the default writer
    (the raw ``tf.summary.write``: no ``tensorboard`` package needed)."""
    import tensorflow as tf

    tf.summary.write(name, tf.constant(float(value), tf.float32), step=int(step),
                     metadata=_scalar_metadata())


def write_scalars(writer: Any | None, step: int, row: dict[str, float]) -> None:
    """Every ``row`` entry as a TensorBoard scalar at ``step`` (nothing when ``writer`` is None)."""
    if writer is None:
        return
    with writer.as_default():
        for name, value in row.items():
            write_scalar(name, value, step)
    writer.flush()
