"""The checkpoints of a training run, on every Keras backend (no TensorFlow needed).

`<model_dir>/checkpoints/ckpt-<step>.weights.h5`: the model's weights, the optimizer's variables
and the `HomographyPairs` seed-generator state (`model.save_weights`); `<step>` is the number of
training batches consumed (the data position), also held in the file (root attribute `STEP`).
Each is written under a temporary name and renamed into place with its SHA-256 beside it
(`<file>.sha256`); only the `keep` newest are kept. A damaged, unchecksummed, misnamed or
unreadable newest checkpoint is set aside (`<file>.bad`, never deleted) and the next older one
resumed. The files themselves are the library's (`aetv2_tf.files.saving`, re-exported here).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import keras
from absl import logging

from aetv2_tf.files.safe_paths import read_regular_file
from aetv2_tf.files.saving import (  # noqa: F401 - the run directory's files, re-exported
    CHECKPOINT_NAME,
    CHECKSUM,
    ENCODER_WEIGHTS,
    damage,
    encoder_source,
    list_checkpoints,
    load_encoder_weights,
    load_model_part,
    save_atomically,
    save_encoder_weights,
)
from aetv2_tf.files.weights_files import file_attributes, save_weights_file, variables_bytes
from aetv2_tf.program.checkpoint_saver import CheckpointStore

BAD = ".bad"  # the suffix of a file set aside
STEP = "aetv2_step"  # the root attribute of a checkpoint file that holds its step


def held_step(path: str) -> int | None:
    """The step the checkpoint at `path` holds: its `STEP` attribute, else the step in the name
    its `<file>.sha256` was written for; None when neither says or the file is unreadable."""
    try:
        stored = file_attributes(path).get(STEP)
    except OSError:
        return None
    if isinstance(stored, int):
        return stored
    try:
        written_as = read_regular_file(path + CHECKSUM, max_bytes=4096).decode().split()[1:2]
    except (OSError, ValueError):  # a FIFO, a device, a large file: no name
        return None
    match = CHECKPOINT_NAME.match(written_as[0]) if written_as else None
    return int(match.group(1)) if match else None


def misnamed(path: str, step: int) -> str | None:
    """Why the checkpoint at `path`, named for `step`, is not that step's (`held_step`), or
    None."""
    held = held_step(path)
    if held is None or held == step:
        return None
    return (f"its name says step {step}, but it holds the checkpoint of step {held} (renamed?); "
            "a checkpoint is resumed only under the name it was written with")


def disk_bytes_needed(model: keras.Model, encoder: keras.Model, keep: int, export: bool,
                      other_writers: int = 0) -> int:
    """Bytes a run writes at most at once: `keep` checkpoints plus the one being written, the
    final `encoder.weights.h5`, with `export` the whole model (`aet_model.keras`) and the
    SavedModel (the encoder, twice while replaced); each of `other_writers` workers keeps one
    throwaway checkpoint and writes the next. Plus 2 % and 1 MiB of file overhead."""
    checkpoint = variables_bytes(model.weights) + variables_bytes(model.optimizer.variables)
    encoder_bytes = variables_bytes(encoder.weights)
    total = (keep + 1 + 2 * other_writers) * checkpoint + encoder_bytes
    if export:
        total += checkpoint + 2 * encoder_bytes
    return int(total * 1.02) + 2**20


def set_aside(path: str, reason: str) -> str:
    """Renames a damaged file (and its checksum) to `<path>.bad`, says so; returns the new path."""
    os.replace(path, path + BAD)
    if os.path.exists(path + CHECKSUM):
        os.replace(path + CHECKSUM, path + BAD + CHECKSUM)
    _say(f"Set aside {path} as {path + BAD}: {reason}.", logging.warning)
    return path + BAD


def _say(message: str, log) -> None:
    """`message` to the log and the console."""
    log(message)
    print(message, flush=True)


class KerasCheckpoints(CheckpointStore):
    """`ckpt-<step>.weights.h5` files in `directory`, written atomically; the `keep` newest are
    kept; `attributes()`: more root attributes of each file, beside its `STEP`."""

    def __init__(self, directory: str, keep: int, attributes: Callable[[], dict] = dict):
        self.directory, self.keep, self.attributes = directory, keep, attributes

    def latest_step(self) -> int | None:
        found = list_checkpoints(self.directory)
        return found[-1][0] if found else None

    def save(self, model: keras.Model, step: int) -> str:
        attributes = {**self.attributes(), STEP: step}
        path = save_atomically(lambda tmp: save_weights_file(model, tmp, attributes),
                               os.path.join(self.directory, f"ckpt-{step}.weights.h5"))
        for _, old in list_checkpoints(self.directory)[:-self.keep]:
            _remove(old, old + CHECKSUM)
        return path

    def set_aside(self, step: int, reason: str) -> None:
        path = os.path.join(self.directory, f"ckpt-{step}.weights.h5")
        if os.path.isfile(path):
            set_aside(path, reason)


def restore_checkpoint(model: keras.Model, directory: str, writer: bool = True) -> int:
    """Loads the newest intact checkpoint of `directory` into `model`; returns its step (0: none).
    A damaged, misnamed or unreadable one is set aside (`writer`; another worker only skips it)
    and the next older one tried; when none is left, FileNotFoundError (exit 2)."""
    found = list_checkpoints(directory)
    if not found:
        logging.info("No checkpoint in %s: starting at step 0.", directory)
        return 0
    for step, path in reversed(found):
        reason = damage(path, required=True) or misnamed(path, step)
        if reason is None:
            try:
                model.load_weights(path)
            except (OSError, ValueError, KeyError) as e:
                first_line = (str(e).splitlines() or [""])[0]
                reason = f"it cannot be read ({type(e).__name__}: {first_line})"
            else:
                _say(f"Resumed from checkpoint {path} at step {step}.", logging.info)
                return step
        if writer:
            set_aside(path, reason)
        else:
            logging.warning("Skipped %s: %s.", path, reason)
    raise FileNotFoundError(f"no intact checkpoint is left in {directory} (each was set aside "
                            "as *.bad); restore one from a backup, or pass --overwrite to start "
                            "afresh there.")


def discard_encoder_weights(model_dir: str) -> None:
    """Removes `<model_dir>/encoder.weights.h5` (and its checksum) before a run trains on: it
    would describe an older end of the run."""
    path = os.path.join(model_dir, ENCODER_WEIGHTS)
    _remove(path, path + CHECKSUM)


def _remove(*paths: str) -> None:
    for path in paths:
        if os.path.exists(path):
            os.remove(path)
