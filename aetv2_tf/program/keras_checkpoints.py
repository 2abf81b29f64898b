"""Keras-native checkpoints of the training program, on every Keras backend (no TensorFlow).

Layout under `<model_dir>/checkpoints/`: `ckpt-<step>.weights.h5`, one file per checkpoint, written
by `model.save_weights`: the model's weights, the optimizer's variables (Keras saves those of a
built optimizer with the model's) and the `HomographyPairs` seed-generator state (that layer
saves it itself); `<step>` is the number of training batches consumed, which fixes the data
position (the optimizer's step counter, which fixes the learning rate, is inside); the file
holds it too (its root attribute `STEP`), and a checkpoint whose name says another step (a
renamed file: `misnamed`) is set aside like a damaged one. The weights are serialised in memory
and written with plain writes (`files.weights_files`: a full disk is an OSError, never an HDF5
crash). A checkpoint is
written to a temporary name in the same directory and renamed into place (`os.replace`, atomic),
so a listed `ckpt-*.weights.h5` is always complete; only the `keep` newest are kept. Beside
each file its SHA-256 (`<file>.sha256`, written before the file is renamed into place), checked
before the file is trusted (`damage`): a resumed run sets a damaged or unreadable newest
checkpoint aside (renamed `<file>.bad`, never deleted) and resumes from the newest good one;
the probes' and the export's readers skip it. A checkpoint without its checksum is damaged too
(deleting the `.sha256` would otherwise let a changed file be resumed).

The files themselves (atomic writes, checksums, the listing, `encoder.weights.h5`) are the
library's (`aetv2_tf.files.saving`, re-exported here); this module adds the store, the resume and
the disk arithmetic of a run. `<model_dir>/encoder.weights.h5` (`ENCODER_WEIGHTS`, written at the
end of a run): the encoder alone, a keras-BatchNorm NIN/AlexNet; `load_encoder_weights` loads
it (or, for a run cut short, the encoder inside its newest checkpoint) into a backbone with
either batch norm: the fused and the Keras BN layer have the same variables in the same order
(`models/layers.py`), but `.weights.h5` files key layers by class, so the weights go through a
keras-BN twin.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import keras
from absl import logging

from aetv2_tf.files.saving import (  # noqa: F401 - the run directory's files, re-exported
    CHECKPOINT_NAME,
    CHECKSUM,
    ENCODER_WEIGHTS,
    damage,
    encoder_source,
    file_digest,
    list_checkpoints,
    load_encoder_weights,
    load_model_part,
    save_atomically,
    save_encoder_weights,
    tensorflow_run_unreadable,
    write_atomically,
)
from aetv2_tf.files.weights_files import file_attributes, save_weights_file, variables_bytes
from aetv2_tf.program.checkpoint_saver import CheckpointStore

BAD = ".bad"  # the suffix of a file set aside
STEP = "aetv2_step"  # the root attribute of a checkpoint file that holds its step


def held_step(path: str) -> int | None:
    """The step the checkpoint at `path` holds: its `STEP` attribute; for a checkpoint without
    one, the step in the name its checksum was written for (`<file>.sha256`: "<digest>
    ckpt-<step>.weights.h5"); None when neither says (or the file cannot be read: loading it
    then says why)."""
    try:
        stored = file_attributes(path).get(STEP)
    except OSError:
        return None
    if isinstance(stored, int):
        return stored
    try:
        with open(path + CHECKSUM) as f:
            written_as = f.read().split()[1:2]
    except (OSError, UnicodeDecodeError):
        return None
    match = CHECKPOINT_NAME.match(written_as[0]) if written_as else None
    return int(match.group(1)) if match else None


def misnamed(path: str, step: int) -> str | None:
    """Why the checkpoint at `path`, named for `step`, is not that step's (`held_step`: it was
    renamed, e.g. ckpt-2 to ckpt-3 with its checksum), or None."""
    held = held_step(path)
    if held is None or held == step:
        return None
    return (f"its name says step {step}, but it holds the checkpoint of step {held} (renamed?); "
            "a checkpoint is resumed only under the name it was written with")


def disk_bytes_needed(model: keras.Model, encoder: keras.Model, keep: int, export: bool,
                      other_writers: int = 0) -> int:
    """What a run writes at most at once, from its model: `keep` checkpoints plus the one being
    written (weights and optimizer moments: about 650 MB for AlexNet with Adam, 17 MB for NIN),
    the final `encoder.weights.h5`, and with `export` the whole model with its optimizer
    (`aet_model.keras`) and the SavedModel (the encoder, twice while it is replaced); each of
    `other_writers` workers keeps one throwaway checkpoint and writes the next. Plus 2 % and
    1 MiB of file overhead."""
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
    message = f"Set aside {path} as {path + BAD}: {reason}."
    logging.warning(message)
    print(message, flush=True)
    return path + BAD


class KerasCheckpoints(CheckpointStore):
    """`ckpt-<step>.weights.h5` files in `directory`, written atomically; the `keep` newest are
    kept (`checkpoint_saver.CheckpointSaver` saves into it, after its finiteness check).
    `attributes()`: more root attributes of each file, beside its `STEP`."""

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
            os.remove(old)
            if os.path.exists(old + CHECKSUM):
                os.remove(old + CHECKSUM)
        return path

    def set_aside(self, step: int, reason: str) -> None:
        path = os.path.join(self.directory, f"ckpt-{step}.weights.h5")
        if os.path.isfile(path):
            set_aside(path, reason)


def restore_checkpoint(model: keras.Model, directory: str, writer: bool = True) -> int:
    """Loads the newest intact checkpoint of `directory` into `model` (its optimizer built
    first); returns its step, 0 when there is none. A damaged (its checksum missing or not its
    own), misnamed (`misnamed`: the step of its name not the one it holds) or unreadable one
    is set aside
    (`writer`; another worker only skips it) and the next older one tried; when none is left,
    FileNotFoundError (exit 2): the run is not restarted from scratch behind the user's back."""
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
                message = f"Resumed from checkpoint {path} at step {step}."
                logging.info(message)
                print(message, flush=True)
                return step
        if writer:
            set_aside(path, reason)
        else:
            logging.warning("Skipped %s: %s.", path, reason)
    raise FileNotFoundError(f"no intact checkpoint is left in {directory} (each was set aside as "
                     "*.bad); restore one from a backup, or pass --overwrite to start afresh "
                     "there.")


def discard_encoder_weights(model_dir: str) -> None:
    """Removes `<model_dir>/encoder.weights.h5` before a run trains on: from then on it would
    describe an older end of the run (the newest checkpoint is the truth until the new end)."""
    path = os.path.join(model_dir, ENCODER_WEIGHTS)
    for name in (path, path + CHECKSUM):
        if os.path.exists(name):
            os.remove(name)


