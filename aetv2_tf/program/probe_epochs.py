"""A probe head's epochs kept and resumed, and its stop on a signal (`probe_stage.fit_head`)."""

from __future__ import annotations

import json
import os

import keras

from aetv2_tf.files.weights_files import file_attributes
from aetv2_tf.probes.classifier import compile_probe
from aetv2_tf.program.checkpoint_saver import CheckpointSaver
from aetv2_tf.program.keras_checkpoints import (
    KerasCheckpoints,
    list_checkpoints,
    restore_checkpoint,
)
from aetv2_tf.program.signal_stop import Interrupted, SignalStop

#: The checkpoint attribute that holds the validation top-1 (fractions) of the epochs done.
VAL_HISTORY = "val_top1_history"


class EpochCheckpoints(keras.callbacks.Callback):
    """A head's epochs kept and resumed (`train_probe`'s last callback): after each epoch its
    checkpoint in ``directory`` (`keras_checkpoints`: the model with its optimizer, the epoch
    as its step, `VAL_HISTORY`; the newest kept; the ``chief``'s, every worker resumes from
    them); then, after a SIGTERM or SIGINT (`SignalStop`, from `resume` on), `Interrupted`."""

    def __init__(self, directory: str, epochs: int, chief: bool):
        super().__init__()
        self.directory, self.epochs, self.history = directory, epochs, []
        store = KerasCheckpoints(directory, 1, lambda: {VAL_HISTORY: json.dumps(self.history)})
        self.saver = CheckpointSaver(store, 1, chief) if chief else None
        self.signals = SignalStop(writing=self.saver.writing if chief else None)

    def resume(self, model: keras.Model, optimizer: keras.optimizers.Optimizer) -> list[float]:
        """The validation top-1 of the epochs done: with a checkpoint, ``model`` compiled with
        ``optimizer`` and the newest one loaded (`restore_checkpoint`); without, none."""
        self.signals.install()
        if not list_checkpoints(self.directory):
            return []
        compile_probe(model, optimizer)
        optimizer.build(model.trainable_variables)
        epoch = restore_checkpoint(model, self.directory, writer=self.saver is not None)
        path = os.path.join(self.directory, f"ckpt-{epoch}.weights.h5")
        self.history = json.loads(file_attributes(path)[VAL_HISTORY]) if epoch else []
        return self.history

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.history.append(float((logs or {})["val_top1"]))
        if self.saver is not None:
            self.saver.save(self.model, epoch + 1)
        if self.signals.stops():
            self.signals.restore()
            raise Interrupted(self.signals.received, f"after epoch {epoch + 1} of {self.epochs}, "
                              "its checkpoint written: the probe is NOT finished; rerun the "
                              "same command to go on from there")
