"""Keras-native checkpoints of the training program, on every Keras backend (no TensorFlow).

Layout under `<model_dir>/checkpoints/`: `ckpt-<step>.weights.h5`, one file per checkpoint, written
by `model.save_weights`: the model's weights, the optimizer's variables (Keras saves those of a
built optimizer with the model's) and the `HomographyPairs` seed-generator state (that layer
saves it itself); `<step>` is the number of training batches consumed, which fixes the data
position (the optimizer's step counter, which fixes the learning rate, is inside). A checkpoint is
written to a temporary name in the same directory and renamed into place (`os.replace`, atomic),
so a listed `ckpt-*.weights.h5` is always complete; only the `keep` newest are kept. Beside
each file its SHA-256 (`<file>.sha256`, written before the file is renamed into place), checked
before the file is trusted (`damage`): a resumed run sets a damaged or unreadable newest
checkpoint aside (renamed `<file>.bad`, never deleted) and resumes from the newest good one;
the probes' and the export's readers skip it. Files of earlier versions have no checksum and are
trusted as before.

`<model_dir>/encoder.weights.h5` (`ENCODER_WEIGHTS`, written at the end of a run): the encoder
alone, a keras-BatchNorm NIN/AlexNet; `load_encoder_weights` loads it (or, for a run cut short,
the encoder inside its newest checkpoint) into a backbone with either batch norm: the fused and
the Keras BN layer have the same variables in the same order (`models/layers.py`), but
`.weights.h5` files key layers by class, so the weights go through a keras-BN twin.
"""

from __future__ import annotations

import hashlib
import math
import os
import re

import keras
import numpy as np
from absl import logging

from aetv2_tf.program.callbacks import CheckpointStore

ENCODER_WEIGHTS = "encoder.weights.h5"
CHECKSUM = ".sha256"  # the suffix of a file's checksum beside it
BAD = ".bad"  # the suffix of a file set aside
_NAME = re.compile(r"^ckpt-(\d+)\.weights\.h5$")


def list_checkpoints(directory: str) -> list[tuple[int, str]]:
    """`(step, path)` of every complete checkpoint in `directory`, oldest first."""
    if not os.path.isdir(directory):
        return []
    found = ((_NAME.match(name), name) for name in os.listdir(directory))
    return sorted((int(m.group(1)), os.path.join(directory, name)) for m, name in found if m)


def save_atomically(saver, path: str) -> str:
    """`saver(tmp)`, its bytes flushed to the disk, then `os.replace(tmp, path)`; tmp ends like
    `path` (Keras checks suffixes). Temporaries that a killed process left beside it are
    removed first (never those of a live process)."""
    directory, name = os.path.split(path)
    os.makedirs(directory or ".", exist_ok=True)
    tmp = os.path.join(directory, f".tmp{os.getpid()}-{name}")
    for other in os.listdir(directory or "."):  # `.tmp<pid>-<name or a checkpoint's name>`
        head, _, rest = other.partition("-")
        if head.startswith(".tmp") and head[4:].isdigit() and (rest == name or _NAME.match(rest)) \
                and not _alive(int(head[4:])):
            os.remove(os.path.join(directory, other))
    try:
        saver(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        write_text_atomically(path + CHECKSUM, f"{file_digest(tmp)}  {name}\n")  # before the file
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def variables_bytes(variables) -> int:
    """Bytes that `variables` take in a `.weights.h5` file (their shapes x dtype sizes)."""
    return sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in variables)


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


def write_text_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def file_digest(path: str) -> str:
    """The SHA-256 of the file at `path`, in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def damage(path: str) -> str | None:
    """Why the file at `path` cannot be trusted (its SHA-256 is not the one written with it), or
    None: intact, or written before checksums existed."""
    sidecar = path + CHECKSUM
    if not os.path.exists(sidecar):
        return None
    with open(sidecar) as f:
        expected = f.read().split()[:1]
    if expected != [file_digest(path)]:
        return f"its SHA-256 is not the one in {os.path.basename(sidecar)}: the file changed " \
               "on disk after it was written"
    return None


def set_aside(path: str, reason: str) -> str:
    """Renames a damaged file (and its checksum) to `<path>.bad`, says so; returns the new path."""
    os.replace(path, path + BAD)
    if os.path.exists(path + CHECKSUM):
        os.replace(path + CHECKSUM, path + BAD + CHECKSUM)
    message = f"Set aside {path} as {path + BAD}: {reason}."
    logging.warning(message)
    print(message, flush=True)
    return path + BAD


def _alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (this process counts as dead: its own earlier
    temporaries are leftovers)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class KerasCheckpoints(CheckpointStore):
    """`ckpt-<step>.weights.h5` files in `directory`, written atomically; the `keep` newest are
    kept (`callbacks.CheckpointEvery` saves into it, after its finiteness check)."""

    def __init__(self, directory: str, keep: int):
        self.directory, self.keep = directory, keep

    def latest_step(self) -> int | None:
        found = list_checkpoints(self.directory)
        return found[-1][0] if found else None

    def save(self, model: keras.Model, step: int) -> str:
        path = save_atomically(model.save_weights,
                               os.path.join(self.directory, f"ckpt-{step}.weights.h5"))
        for _, old in list_checkpoints(self.directory)[:-self.keep]:
            os.remove(old)
            if os.path.exists(old + CHECKSUM):
                os.remove(old + CHECKSUM)
        return path


def restore_checkpoint(model: keras.Model, directory: str, writer: bool = True) -> int:
    """Loads the newest intact checkpoint of `directory` into `model` (its optimizer built
    first); returns its step, 0 when there is none. A damaged or unreadable one is set aside
    (`writer`; another worker only skips it) and the next older one tried; when none is left,
    FileNotFoundError (exit 2): the run is not restarted from scratch behind the user's back."""
    found = list_checkpoints(directory)
    if not found:
        logging.info("No checkpoint in %s: starting at step 0.", directory)
        return 0
    for step, path in reversed(found):
        reason = damage(path)
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


def tensorflow_run_unreadable(model_dir: str, saved: dict) -> str | None:
    """Why a run of the TensorFlow program cannot be read on this (non-TensorFlow) backend, or
    None: its checkpoints hold TensorFlow's layers (fused batch norm) or are in the
    `tf.train.Checkpoint` format of earlier versions; its `encoder.weights.h5` (finished runs)
    is read everywhere."""
    if saved.get("backend", "tensorflow") != "tensorflow" or keras.backend.backend() == \
            "tensorflow" or os.path.isfile(os.path.join(model_dir, ENCODER_WEIGHTS)):
        return None
    return (f"{model_dir} is a run of the TensorFlow program without {ENCODER_WEIGHTS} (it is "
            f"unfinished, or older than that file): its TensorFlow checkpoints load under "
            f"KERAS_BACKEND=tensorflow only; finish the run (rerun its command) or run this "
            f"with KERAS_BACKEND=tensorflow.")


def discard_encoder_weights(model_dir: str) -> None:
    """Removes `<model_dir>/encoder.weights.h5` before a run trains on: from then on it would
    describe an older end of the run (the newest checkpoint is the truth until the new end)."""
    path = os.path.join(model_dir, ENCODER_WEIGHTS)
    for name in (path, path + CHECKSUM):
        if os.path.exists(name):
            os.remove(name)


def save_encoder_weights(encoder: keras.Model, backbone: str, model_dir: str) -> str:
    """Writes `<model_dir>/encoder.weights.h5` atomically in the keras-BN layout that every
    backend reads (`load_encoder_weights`): the weights go through a keras-BN twin (the fused
    and the Keras BN layer have the same variables in the same order)."""
    from aetv2_tf.models import build_backbone

    twin = build_backbone(backbone, tuple(encoder.input_shape[1:]), batch_norm="keras")
    twin.set_weights(encoder.get_weights())
    return save_atomically(twin.save_weights, os.path.join(model_dir, ENCODER_WEIGHTS))


def encoder_source(model_dir: str) -> str | None:
    """Where `load_encoder_weights` reads: `encoder.weights.h5`, else the newest checkpoint;
    a file whose checksum does not match is skipped with a warning (readers do not rename)."""
    candidates = [os.path.join(model_dir, ENCODER_WEIGHTS)] + [
        path for _, path in reversed(list_checkpoints(os.path.join(model_dir, "checkpoints")))]
    for path in candidates:
        if not os.path.isfile(path):
            continue
        reason = damage(path)
        if reason is None:
            return path
        logging.warning("Skipped %s: %s.", path, reason)
    return None


def load_encoder_weights(model_dir: str, saved: dict, batch_norm: str) -> keras.Model:
    """The encoder of a run (`saved`: its flags.json), with `batch_norm`.

    Reads `model_dir/encoder.weights.h5`, else the newest `checkpoints/ckpt-*.weights.h5`: the
    run's whole pretext model is rebuilt to read it (the pairs/rotations model of
    `program.adapter_portable`, the AET/rotation model of the TensorFlow program, with the
    run's batch norm). FileNotFoundError when neither exists.
    """
    from aetv2_tf.models import (
        DEFAULT_INPUT_SHAPES,
        build_aet_model,
        build_backbone,
        build_rotation_model,
    )
    from aetv2_tf.models.pairs import build_pairs_model, build_rotations_model

    shape = DEFAULT_INPUT_SHAPES[saved["backbone"]]
    twin = build_backbone(saved["backbone"], shape, batch_norm="keras")
    path = encoder_source(model_dir)
    if path is None:
        raise FileNotFoundError(f"neither {os.path.join(model_dir, ENCODER_WEIGHTS)} nor a "
                                f"checkpoint in {model_dir}/checkpoints: train first.")
    rotation = saved.get("pretext") == "rotation"
    if path.endswith(ENCODER_WEIGHTS):
        twin.load_weights(path)
    elif saved.get("backend", "tensorflow") == "tensorflow":
        owner = build_backbone(saved["backbone"], shape,
                               batch_norm=saved.get("batch_norm", "keras"))
        load_model_part(build_rotation_model(owner) if rotation else build_aet_model(owner),
                         path)
        twin.set_weights(owner.get_weights())
    else:
        load_model_part((build_rotations_model if rotation else build_pairs_model)(twin, seed=0),
                         path)
    logging.info("Loaded the encoder from %s.", path)
    if batch_norm == "keras":
        return twin
    encoder = build_backbone(saved["backbone"], shape, batch_norm=batch_norm)
    encoder.set_weights(twin.get_weights())
    return encoder


def load_model_part(model: keras.Model, path: str) -> None:
    """`model.load_weights(path)` for a checkpoint that also holds optimizer variables, which
    an uncompiled model has no place for (Keras then warns; the layers load all the same)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.load_weights(path)
