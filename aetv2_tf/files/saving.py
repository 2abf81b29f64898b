"""An encoder trained in Python, saved as a directory the programs accept, and loaded back.

    aetv2_tf.save_encoder(encoder, "runs/my_encoder", recipe="aetv2", dataset="cifar10")
    encoder = aetv2_tf.load_encoder("runs/my_encoder")          # any Keras backend
    encoder = aetv2_tf.load_encoder("aetv1_cifar10")            # a preset (`aetv2_tf.presets()`)
    mean_std = aetv2_tf.preprocessing("runs/my_encoder")        # {"mean": ..., "std": ...}
    python -m aetv2_tf.train --flagfile=configs/cifar10_probe_conv.cfg --pretrained=runs/my_encoder

For the package's backbones the directory is what a pretraining run leaves for its readers:
``encoder.weights.h5`` (the Keras-BatchNorm layout every backend reads) and ``flags.json`` (what
the encoder is). Any other Keras encoder is written whole as ``encoder.keras``, its record
saying ``"custom_encoder": true``; the command line does not read those. Below: the files of a
run directory (`save_atomically` with its SHA-256 beside it, `damage`, `list_checkpoints`, the
encoder's weights).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import keras
from absl import logging

from aetv2_tf.data.constants import normalization_constants
from aetv2_tf.files import presets
from aetv2_tf.files.digests import file_digest
from aetv2_tf.files.safe_paths import (
    process_alive,
    read_json,
    read_regular_file,
    write_atomically,
)
from aetv2_tf.files.weights_files import save_weights_file
from aetv2_tf.files.write_targets import SAVED_BY, check_encoder_target
from aetv2_tf.method.recipes import Recipe, as_recipe

ENCODER_WEIGHTS = "encoder.weights.h5"
#: A custom encoder (not a `build_backbone` one), saved whole by `save_encoder`.
ENCODER_FILE = "encoder.keras"
CHECKSUM = ".sha256"  # the suffix of a file's checksum beside it
#: A checkpoint of a run: `checkpoints/ckpt-<step>.weights.h5` (`program.keras_checkpoints`).
CHECKPOINT_NAME = re.compile(r"^ckpt-(\d+)\.weights\.h5$")


def save_encoder(encoder: keras.Model, directory: str, *, recipe: Recipe | str | None = None,
                 pretext: str = "aet", dataset: str = "cifar10", overwrite: bool = False) -> str:
    """Writes ``encoder`` to ``directory`` (module docstring) and returns ``directory``.

    ``encoder``: a `build_backbone` model (weights only) or any functional / Sequential model
    (whole). ``recipe``: a `Recipe` or its name (None: the method left unknown); ``pretext``:
    "aet" or "rotation"; ``dataset``: fixes the normalisation ("cifar10": CIFAR-10's, else
    ImageNet's). The record's ``image_size`` is the input's side (``null``: any size).
    ``directory`` must be new, empty, or (with ``overwrite=True``) an earlier `save_encoder`'s;
    else `errors.UsageError`, nothing written. Everything is checked before it is made.
    """
    from aetv2_tf.models.backbones import input_side

    recipe = None if recipe is None else as_recipe(recipe)
    if pretext not in ("aet", "rotation"):
        raise ValueError(f"pretext must be 'aet' or 'rotation', got {pretext!r}")
    if not isinstance(encoder, keras.Model):
        raise TypeError(f"save_encoder: expected a keras.Model encoder, got "
                        f"{type(encoder).__name__}")
    twin = _package_twin(encoder)
    if twin is None:
        from aetv2_tf.models.features import output_names

        features = output_names(encoder)  # a clear error for a model without symbolic outputs
    record = {"stage": "pretext", "pretext": pretext, "backbone": encoder.name,
              "dataset": dataset, "batch_norm": "keras", "backend": keras.backend.backend(),
              "loss": recipe.loss.kind if recipe else None, "saved_by": SAVED_BY,
              "image_size": input_side(encoder, any_size=True)}
    check_encoder_target(os.fspath(directory), overwrite, SAVED_ENCODER_FILES)
    os.makedirs(directory, exist_ok=True)
    if twin is not None:  # the run layout
        twin.set_weights(encoder.get_weights())
        save_atomically(lambda tmp: save_weights_file(twin, tmp),
                        os.path.join(directory, ENCODER_WEIGHTS))
        _remove(os.path.join(directory, ENCODER_FILE))
    else:
        save_atomically(encoder.save, os.path.join(directory, ENCODER_FILE))
        _remove(os.path.join(directory, ENCODER_WEIGHTS))
        record.update(backbone="custom", custom_encoder=True, encoder_file=ENCODER_FILE,
                      encoder_name=encoder.name, features=features,
                      input_shape=[None if d is None else int(d)
                                   for d in encoder.inputs[0].shape[1:]])
    write_atomically(os.path.join(directory, "flags.json"), json.dumps(record, indent=2) + "\n")
    return directory


#: The files `save_encoder` writes into its directory.
SAVED_ENCODER_FILES = frozenset({"flags.json", ENCODER_WEIGHTS, ENCODER_WEIGHTS + CHECKSUM,
                                 ENCODER_FILE, ENCODER_FILE + CHECKSUM})


def _package_twin(encoder: keras.Model) -> keras.Model | None:
    """A keras-BN `build_backbone` twin of ``encoder`` when it is such a backbone, else None."""
    from aetv2_tf.models import BACKBONES, build_backbone

    if encoder.name not in BACKBONES or not isinstance(getattr(encoder, "output", None), dict):
        return None
    try:
        twin = build_backbone(encoder.name, tuple(encoder.input_shape[1:]), batch_norm="keras")
    except (ValueError, TypeError):
        return None
    same = sorted(twin.output) == sorted(encoder.output) and \
        [tuple(v.shape) for v in twin.weights] == [tuple(v.shape) for v in encoder.weights]
    return twin if same else None


def _remove(path: str) -> None:
    """Remove a file of the other layout (and its checksum) that an earlier save left."""
    for name in (path, path + CHECKSUM):
        if os.path.isfile(name):
            os.remove(name)


def load_saved_flags(model_dir: str) -> dict:
    """The flags.json that `aetv2_tf.train` wrote in `model_dir` (clear error when absent)."""
    path = os.path.join(model_dir, "flags.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: --model_dir must be a directory written by "
                                "`python -m aetv2_tf.train`.")
    try:
        saved = read_json(path)
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path} is not a readable JSON record of a run ({e}); pass a directory "
                         "written by `python -m aetv2_tf.train`, or restore its flags.json.") from e
    if not isinstance(saved, dict):
        raise ValueError(f"{path} holds a JSON {type(saved).__name__}, not the object of flags "
                         "`python -m aetv2_tf.train` writes; restore its flags.json.")
    return saved


def load_encoder(name_or_directory: str | os.PathLike,
                 batch_norm: str = "keras") -> keras.Model:
    """The encoder in a directory (`save_encoder`'s, a pretraining run's ``--model_dir``, or a
    preset's name), on the current Keras backend; ``batch_norm``: "keras" or "fused" for the
    package's backbones. It takes NORMALISED images, ``(u / 255 - mean) / std``
    (`preprocessing`), and refuses raw pixels (`models.image_models.NormalisedEncoder`)."""
    from aetv2_tf.models.image_models import normalised_encoder

    directory = presets.resolve(name_or_directory)
    if not os.path.isfile(os.path.join(directory, "flags.json")):
        raise FileNotFoundError(f"{directory} has no flags.json: pass a directory written by "
                                "save_encoder, a pretraining run's model_dir, or a preset "
                                f"name {sorted(presets.PRESETS)}")
    saved = load_saved_flags(directory)
    if not saved.get("custom_encoder"):
        return normalised_encoder(load_encoder_weights(directory, saved, batch_norm))
    path = os.path.join(directory, os.path.basename(saved.get("encoder_file") or ENCODER_FILE))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: {directory}'s flags.json records a custom "
                                "encoder saved by aetv2_tf.save_encoder; save it again")
    encoder = load_model(path, compile=False)
    logging.info("Loaded the encoder from %s.", path)
    return normalised_encoder(encoder)


def load_model(path: str | os.PathLike, **kwargs: Any) -> keras.Model:
    """`keras.saving.load_model(path, **kwargs)` of a `.keras` file this project wrote, after
    its digest check: ValueError naming it and the fix for a differing or missing SHA-256."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found")
    reason = damage(path, required=True)
    if reason is not None:
        raise ValueError(f"{path} cannot be trusted: {reason}. Write it again (a run: rerun it, "
                         "or export it; an encoder: save_encoder), or load a file of your own "
                         "with keras.saving.load_model")
    return keras.saving.load_model(path, **kwargs)


def preprocessing(name_or_directory: str | os.PathLike) -> dict[str, tuple[float, ...]]:
    """``{"mean": (3,), "std": (3,)}``: the normalisation ``(u / 255 - mean) / std`` that the
    encoder in a directory (or a preset) expects, e.g.
    ``build_classifier(load_encoder(p), 10, **preprocessing(p))``."""
    directory = presets.resolve(name_or_directory)
    saved = load_saved_flags(directory)
    mean, std = normalization_constants(saved.get("dataset", "cifar10"))
    return {"mean": tuple(mean), "std": tuple(std)}


# ------------------------------------------- the files of a run directory, written atomically
def list_checkpoints(directory: str) -> list[tuple[int, str]]:
    """`(step, path)` of every complete checkpoint in `directory`, oldest first."""
    if not os.path.isdir(directory):
        return []
    found = ((CHECKPOINT_NAME.match(name), name) for name in os.listdir(directory))
    return sorted((int(m.group(1)), os.path.join(directory, name)) for m, name in found if m)


def save_atomically(saver, path: str) -> str:
    """`saver(tmp)` into `path` by `safe_paths.write_atomically`, its SHA-256 written beside it
    (`CHECKSUM`) before the rename; dead processes' temporaries of `path` or a checkpoint are
    removed first."""
    directory, name = os.path.split(path)
    os.makedirs(directory or ".", exist_ok=True)
    for other in os.listdir(directory or "."):  # `.tmp<pid>-<name or a checkpoint's name>`
        head, _, rest = other.partition("-")
        ours = rest == name or CHECKPOINT_NAME.match(rest)
        if head.startswith(".tmp") and head[4:].isdigit() and ours and \
                not process_alive(int(head[4:])):
            os.remove(os.path.join(directory, other))

    def checksum(tmp: str) -> None:
        write_atomically(path + CHECKSUM, f"{file_digest(tmp)}  {name}\n")

    return write_atomically(path, saver, before_replace=checksum)


def damage(path: str, required: bool = False) -> str | None:
    """Why the file at `path` cannot be trusted (its SHA-256 differs; with `required`, also a
    missing `.sha256`), or None."""
    sidecar = path + CHECKSUM
    if not os.path.exists(sidecar):
        if required:
            return f"it has no {os.path.basename(sidecar)} (the SHA-256 written with it), so " \
                   "it cannot be told from a file changed after it was written"
        return None
    try:  # bytes: a sidecar of other bytes is a mismatch, not a crash
        expected = read_regular_file(sidecar, max_bytes=4096).split()[:1]
    except (OSError, ValueError) as e:  # a FIFO, a device, a large file: not a checksum
        return f"its {os.path.basename(sidecar)} cannot be read as a checksum ({e})"
    if expected != [file_digest(path).encode()]:
        return f"its SHA-256 is not the one in {os.path.basename(sidecar)}: the file changed " \
               "on disk after it was written"
    return None


def save_encoder_weights(encoder: keras.Model, backbone: str, model_dir: str) -> str:
    """Writes `<model_dir>/encoder.weights.h5` atomically through a keras-BN twin (the layout
    every backend reads)."""
    from aetv2_tf.models import build_backbone

    twin = build_backbone(backbone, tuple(encoder.input_shape[1:]), batch_norm="keras")
    twin.set_weights(encoder.get_weights())
    return save_atomically(lambda tmp: save_weights_file(twin, tmp),
                           os.path.join(model_dir, ENCODER_WEIGHTS))


def encoder_source(model_dir: str) -> str | None:
    """Where `load_encoder_weights` reads: `encoder.weights.h5`, else the newest checkpoint;
    a damaged file (`damage`; a checkpoint needs its checksum) is skipped with a warning."""
    candidates = [os.path.join(model_dir, ENCODER_WEIGHTS)] + [
        path for _, path in reversed(list_checkpoints(os.path.join(model_dir, "checkpoints")))]
    for path in candidates:
        if not os.path.isfile(path):
            continue
        reason = damage(path, required=not path.endswith(ENCODER_WEIGHTS))
        if reason is None:
            return path
        logging.warning("Skipped %s: %s.", path, reason)
    return None


def load_encoder_weights(model_dir: str, saved: dict, batch_norm: str) -> keras.Model:
    """The encoder of a run (`saved`: its flags.json), with `batch_norm`, from `encoder_source`
    (a checkpoint through the run's rebuilt pretext model); FileNotFoundError for none."""
    from aetv2_tf.models import (
        BACKBONES,
        build_aet_model,
        build_backbone,
        build_rotation_classifier,
    )
    from aetv2_tf.models.pretext import build_pairs_model, build_rotations_model

    if saved.get("custom_encoder"):
        raise ValueError(f"{model_dir} holds a custom encoder ({ENCODER_FILE}, saved by "
                         "aetv2_tf.save_encoder): load it with aetv2_tf.load_encoder; the "
                         "command line and the export take the package's backbones (nin, "
                         "alexnet) only")
    path = encoder_source(model_dir)
    if path is None:
        raise FileNotFoundError(f"neither {os.path.join(model_dir, ENCODER_WEIGHTS)} nor a "
                                f"checkpoint in {model_dir}/checkpoints: train first.")
    rotation = saved.get("pretext") == "rotation"
    try:
        size = saved.get("image_size")  # save_encoder records it; runs: the backbone's default
        shape = (size, size, 3) if size else BACKBONES[saved["backbone"]].input_shape
        twin = build_backbone(saved["backbone"], shape, batch_norm="keras")
        if path.endswith(ENCODER_WEIGHTS):
            twin.load_weights(path)
        elif saved.get("backend", "tensorflow") == "tensorflow":
            owner = build_backbone(saved["backbone"], shape,
                                   batch_norm=saved.get("batch_norm", "keras"))
            load_model_part(build_rotation_classifier(owner) if rotation else
                            build_aet_model(owner), path)
            twin.set_weights(owner.get_weights())
        else:
            pairs = build_rotations_model(twin, seed=0) if rotation else build_pairs_model(
                twin, seed=0, count_steps=saved.get("mse_decay_steps", 0) > 0)  # its loss_step
            load_model_part(pairs, path)
    except (ValueError, KeyError, TypeError, OSError) as e:
        record = {k: saved.get(k) for k in ("backbone", "image_size", "pretext", "batch_norm",
                                            "backend", "mse_decay_steps") if k in saved}
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ValueError(
            f"{path} does not fit the encoder that {os.path.join(model_dir, 'flags.json')} "
            f"describes ({json.dumps(record, default=str)[:300]}): {type(e).__name__}: {first}; "
            "was flags.json edited? Restore the flags.json the run wrote (from a backup), or "
            "pass the directory as the run left it.") from None
    logging.info("Loaded the encoder from %s.", path)
    if batch_norm == "keras":
        return twin
    encoder = build_backbone(saved["backbone"], shape, batch_norm=batch_norm)
    encoder.set_weights(twin.get_weights())
    return encoder


def load_model_part(model: keras.Model, path: str) -> None:
    """`model.load_weights(path)`, Keras's warning about optimizer variables silenced."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.load_weights(path)


def tensorflow_run_unreadable(model_dir: str, saved: dict) -> str | None:
    """Why an unfinished run of the TensorFlow program (no `encoder.weights.h5`) cannot be read
    on this non-TensorFlow backend, or None."""
    if saved.get("custom_encoder") or saved.get("backend", "tensorflow") != "tensorflow" or \
            keras.backend.backend() == "tensorflow" or \
            os.path.isfile(os.path.join(model_dir, ENCODER_WEIGHTS)):
        return None
    return (f"{model_dir} is a run of the TensorFlow program without {ENCODER_WEIGHTS} (it is "
            f"unfinished): its TensorFlow checkpoints load under "
            f"KERAS_BACKEND=tensorflow only; finish the run (rerun its command) or run this "
            f"with KERAS_BACKEND=tensorflow.")
