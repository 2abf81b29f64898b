"""The frozen encoder of a probe: a pretraining run, an exported SavedModel, or a random init.

``--pretrained`` (`pretrained_kind`) is:

* a pretraining ``--model_dir`` (it holds ``flags.json``): the encoder restored from the run
  (`aetv2_tf.files.savedmodel.restore_encoder`), of the probe's ``--backbone``;
* a SavedModel (``saved_model.pb``, e.g. ``<model_dir>/export/encoder``). Loading one runs its
  graph, which may read and write files, so an export of this project (files matching its
  ``aetv2_export.json``, which names the backbone: `aetv2_tf.files.provenance`) is NOT run: the
  backbone is built here and its ``variables/`` read into it as data (`encoder_from_export`).
  Any other runs only with ``--trust_saved_model``: its ``serving_default`` signature takes
  uint8 ``images (B, S, S, 3)``, to which `saved_model_features` maps the normalised batches
  back (``u = round((x * std + mean) * 255)``, exact for CIFAR-10's crops and flips). An export
  inside a model_dir is loaded as asked (`aetv2_tf.export` may have used another checkpoint);
* ``none``: a random-init backbone seeded by ``--seed``.

A Keras encoder is cut to the layers its feature needs (`truncate`). Every failure is a
`UsageError` with the fix; `check_pretrained` makes the cheap checks before anything is written.
TensorFlow is imported only for SavedModels and TensorFlow checkpoints.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence

import keras

from aetv2_tf.errors import UsageError
from aetv2_tf.files.provenance import export_record, verify_export
from aetv2_tf.files.savedmodel import restore_encoder
from aetv2_tf.files.saving import load_saved_flags
from aetv2_tf.models import BACKBONES, build_backbone

_EXPORT_HINT = ("export an encoder with `python -m aetv2_tf.export --model_dir=<pretraining "
                "run>` (it writes <model_dir>/export/encoder), or pass the pretraining "
                "--model_dir itself")


@dataclasses.dataclass(frozen=True)
class Encoder:
    """A frozen feature extractor and where it came from; ``model`` (a Keras model, or a
    function for a SavedModel) maps normalised images ``(B, S, S, 3)`` float32 to a dict of
    feature maps (``{"block2": (B, 8, 8, 192)}``)."""

    model: Callable
    feature: str
    kind: str  # "model_dir" | "saved_model" | "none"
    source: str | None  # absolute path of --pretrained, None for a random init
    method: str | None  # AETv2 / AETv1 / RotNet / random; None when unknown
    checkpoint: str | None = None


def resolve_feature(backbone: str, feature: str | None) -> str:
    """``--feature``, checked against the backbone's outputs (None: its probe feature,
    `models.backbones`: NIN block2, AlexNet conv5)."""
    features = BACKBONES[backbone].features
    feature = feature or BACKBONES[backbone].probe_feature
    if feature not in features:
        raise UsageError(f"--feature={feature} is not an output of --backbone={backbone}; use one "
                         f"of {', '.join(features)}.")
    return feature


def pretrained_kind(pretrained: str) -> str:
    """``"none"``, ``"model_dir"`` or ``"saved_model"``; a UsageError for anything else."""
    if pretrained.strip().lower() == "none":
        return "none"
    path = os.path.expanduser(pretrained)
    if not os.path.exists(path):
        raise UsageError(f"--pretrained={pretrained} does not exist; pass a pretraining "
                         "--model_dir, its export/encoder SavedModel, or --pretrained=none for "
                         "a random-init encoder.")
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        return "saved_model"
    if os.path.isfile(os.path.join(path, "flags.json")):
        return "model_dir"
    raise UsageError(f"--pretrained={pretrained} is neither a pretraining --model_dir (no "
                     "flags.json) nor a SavedModel (no saved_model.pb); pass the --model_dir "
                     "of a `python -m aetv2_tf.train --stage=pretext` run or its export/encoder.")


def check_saved_model_trusted(path: str, trust_saved_model: bool = False) -> None:
    """UsageError unless the SavedModel at ``path`` may be used: a project export whose files
    match its manifest and whose manifest records the encoder (read as data, never run), or any
    SavedModel with ``trust_saved_model`` (run as a graph; module docstring)."""
    if trust_saved_model:
        return
    path = os.path.expanduser(path)
    why = verify_export(path)
    if why is None and export_record(path) is None:
        why = ("its manifest records no encoder to rebuild; re-export it with python -m "
               "aetv2_tf.export")
    if why is not None:
        raise UsageError(
            f"--pretrained={path} is a SavedModel that this project cannot recognise as its own "
            f"export ({why}). A SavedModel is a program: loading it runs its graph, which can "
            "read and write files, so it is not loaded. Pass the pretraining --model_dir "
            "instead (its weights are loaded, nothing is run), re-export it with `python -m "
            "aetv2_tf.export --model_dir=...`, or, only if you trust whoever wrote it, add "
            "--trust_saved_model.")


def check_pretrained(pretrained: str, backbone: str, *, trust_saved_model: bool = False) -> str:
    """The cheap checks of ``--pretrained`` (exists, kind, a run's backbone, a SavedModel's
    manifest unless ``trust_saved_model``); returns the kind."""
    kind = pretrained_kind(pretrained)
    if kind == "saved_model" and keras.backend.backend() != "tensorflow":
        raise UsageError(f"--pretrained={pretrained} is a TensorFlow SavedModel, which runs "
                         f"under KERAS_BACKEND=tensorflow only; pass the pretraining --model_dir "
                         f"it was exported from (its encoder.weights.h5 loads on every backend).")
    if kind == "saved_model":
        check_saved_model_trusted(pretrained, trust_saved_model)
    if kind == "model_dir":
        try:
            saved = load_saved_flags(os.path.expanduser(pretrained))
        except ValueError as e:
            raise UsageError(f"--pretrained={pretrained}: {e}") from e
        if saved.get("stage") != "pretext":
            raise UsageError(f"--pretrained={pretrained} holds a --stage={saved.get('stage')} "
                             "run, not a pretraining run; pass the --model_dir of a "
                             "--stage=pretext run.")
        if saved.get("backbone") != backbone:
            raise UsageError(
                f"--pretrained={pretrained} was pretrained with --backbone="
                f"{saved.get('backbone')} (dataset {saved.get('dataset')}), but this probe uses "
                f"--backbone={backbone}; pass a {backbone} run, or probe this one with "
                f"--backbone={saved.get('backbone')} on a dataset of its image size.")
        from aetv2_tf.files.saving import tensorflow_run_unreadable

        why = tensorflow_run_unreadable(os.path.expanduser(pretrained), saved)
        if why is not None:
            raise UsageError(f"--pretrained={pretrained}: {why}")
    return kind


def method_from_flags(saved: dict | None) -> str | None:
    """The pretext method of a pretraining run's flags: RotNet, AETv2 (geodesic), AETv1 (mse)."""
    if not saved or saved.get("stage") != "pretext":
        return None
    if saved.get("pretext") == "rotation":
        return "RotNet"
    return {"geodesic": "AETv2", "mse": "AETv1"}.get(saved.get("loss"))


def truncate(encoder: keras.Model, feature: str) -> keras.Model:
    """The sub-model of a dict-output encoder computing only ``{feature: ...}`` (shared weights)."""
    outputs = encoder.output
    if feature not in outputs:
        raise UsageError(f"the encoder has no output --feature={feature}; it has "
                         f"{', '.join(sorted(outputs))}.")
    return keras.Model(encoder.input, {feature: outputs[feature]}, name=f"{encoder.name}_"
                       f"{feature}")


def saved_model_features(path: str, feature: str, image_size: int, mean: Sequence[float],
                         std: Sequence[float], *, trust_saved_model: bool = False) -> Callable:
    """``fn(images (B, S, S, 3) float32 normalised, training=None) -> dict`` of the outputs of
    the SavedModel at ``path`` (images mapped back to uint8 exactly; other shapes raise
    InvalidArgumentError before it runs). Loads only a verified project export unless
    ``trust_saved_model`` (`check_saved_model_trusted`, right before ``tf.saved_model.load``)."""
    import tensorflow as tf

    check_saved_model_trusted(path, trust_saved_model)
    try:
        loaded = tf.saved_model.load(path)
    except Exception as e:  # noqa: BLE001 - any load failure is the user's path
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"--pretrained={path} is not a loadable SavedModel ({reason}); "
                         f"{_EXPORT_HINT}.") from e
    signature = loaded.signatures.get("serving_default")
    if signature is None:
        raise UsageError(f"--pretrained={path} is a SavedModel without the serving_default "
                         f"signature (it has {sorted(loaded.signatures) or 'none'}); "
                         f"{_EXPORT_HINT}.")
    spec = signature.structured_input_signature[1].get("images")
    wanted = (image_size, image_size, 3)
    if spec is None or spec.dtype != tf.uint8 or tuple(spec.shape[1:]) != wanted:
        got = "no 'images' input" if spec is None else f"images {spec.dtype.name} {spec.shape}"
        raise UsageError(f"--pretrained={path}: serving_default takes {got}, but this probe feeds "
                         f"uint8 images (B, {image_size}, {image_size}, 3) (the backbone's "
                         f"input size); {_EXPORT_HINT}.")
    outputs = signature.structured_outputs
    if feature not in outputs:
        raise UsageError(f"--pretrained={path}: serving_default returns "
                         f"{', '.join(sorted(outputs))}, not --feature={feature}; pick one of "
                         "them.")
    mean_t, std_t = tf.constant(mean, tf.float32), tf.constant(std, tf.float32)

    def features(images, training=None):
        del training  # the exported encoder always runs in inference mode
        # A batch of the signature's size, checked before the call: an export written before
        # its signature checked its input aborts the process on an unbatched image.
        images = tf.ensure_shape(images, [None, image_size, image_size, 3])
        pixels = (tf.cast(images, tf.float32) * std_t + mean_t) * 255.0
        pixels = tf.cast(tf.round(tf.clip_by_value(pixels, 0.0, 255.0)), tf.uint8)
        return signature(images=pixels)

    features.saved_model = loaded  # keeps the loaded variables alive
    return features


def encoder_from_export(path: str, backbone: str, *, batch_norm: str, mean: Sequence[float],
                        std: Sequence[float]) -> keras.Model:
    """The ``backbone`` of a verified project export at ``path``, its ``variables/<i>`` read into
    ``encoder.variables[i]`` as data (the graph never loaded); UsageError when the record names
    another backbone, input size or normalisation (``mean``, ``std``), or variables misfit."""
    import numpy as np
    import tensorflow as tf

    record = export_record(path)
    if record is None:
        raise UsageError(f"--pretrained={path}: its manifest records no encoder; re-export it.")
    shape = tuple(record["input_shape"])
    if record["name"] != backbone or shape != BACKBONES[backbone].input_shape:
        raise UsageError(f"--pretrained={path} holds a {record['name']} encoder for {shape} "
                         f"images, but this probe uses --backbone={backbone} "
                         f"{BACKBONES[backbone].input_shape}; pass a {backbone} export.")
    if not (np.allclose(record["mean"], mean, atol=1e-6) and
            np.allclose(record["std"], std, atol=1e-6)):
        raise UsageError(f"--pretrained={path} normalises images with mean {record['mean']}, std "
                         f"{record['std']}, this probe's dataset with {list(mean)}, {list(std)}; "
                         "probe the pretraining --model_dir instead, or the same dataset.")
    model = build_backbone(backbone, shape, batch_norm=batch_norm)
    try:
        reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
        values = [reader.get_tensor(f"variables/{i}/.ATTRIBUTES/VARIABLE_VALUE")
                  for i in range(len(model.variables))]
        extra = reader.has_tensor(f"variables/{len(model.variables)}/.ATTRIBUTES/VARIABLE_VALUE")
    except (tf.errors.OpError, ValueError) as e:
        raise UsageError(f"--pretrained={path}: its variables could not be read ({e}); "
                         f"{_EXPORT_HINT}.") from e
    wrong = [v.path for v, x in zip(model.variables, values, strict=True)
             if tuple(v.shape) != tuple(x.shape)]
    if wrong or extra or record["shapes"] != [list(v.shape) for v in model.variables]:
        raise UsageError(f"--pretrained={path}: its variables do not fit a {backbone} encoder "
                         f"({', '.join(wrong[:3]) or 'another count'}); {_EXPORT_HINT}.")
    for variable, value in zip(model.variables, values, strict=True):
        variable.assign(value)
    return model


def _exporting_run_flags(saved_model: str) -> dict | None:
    """The flags of the run that exported ``<model_dir>/export/encoder``, if it is one."""
    export_dir = os.path.dirname(saved_model)
    run_dir = os.path.dirname(export_dir)
    if os.path.basename(export_dir) != "export" or not os.path.isfile(
            os.path.join(run_dir, "flags.json")):
        return None
    try:
        return load_saved_flags(run_dir)
    except ValueError:  # a damaged record only loses the method label
        return None


def load_frozen_encoder(pretrained: str, backbone: str, feature: str, *, batch_norm: str,
                        mean: Sequence[float], std: Sequence[float],
                        trust_saved_model: bool = False) -> Encoder:
    """The frozen encoder named by ``--pretrained`` (module docstring), cut to ``feature``;
    a SavedModel only when it is a verified export of this project or ``trust_saved_model``."""
    kind = check_pretrained(pretrained, backbone, trust_saved_model=trust_saved_model)
    input_shape = BACKBONES[backbone].input_shape
    if kind == "none":
        model = build_backbone(backbone, input_shape, batch_norm=batch_norm)
        return Encoder(truncate(model, feature), feature, kind, None, "random")
    path = os.path.abspath(os.path.expanduser(pretrained))
    if kind == "saved_model":
        method = method_from_flags(_exporting_run_flags(path))
        if verify_export(path) is None and export_record(path) is not None:
            model = encoder_from_export(path, backbone, batch_norm=batch_norm, mean=mean, std=std)
            return Encoder(truncate(model, feature), feature, kind, path, method,
                           checkpoint=os.path.join(path, "variables"))
        fn = saved_model_features(path, feature, input_shape[0], mean, std,
                                  trust_saved_model=trust_saved_model)
        return Encoder(fn, feature, kind, path, method)
    errors: tuple[type[BaseException], ...] = (ValueError, OSError, KeyError, TypeError)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        errors += (tf.errors.OpError,)
    try:
        model, saved = restore_encoder(path)
    except errors as e:
        raise UsageError(f"--pretrained={pretrained}: the encoder could not be restored ({e}); "
                         "pass a pretraining --model_dir with a checkpoint.") from e
    from aetv2_tf.files.saving import encoder_source

    checkpoint = encoder_source(path)
    if checkpoint is None:  # a run whose checkpoints are tf.train.Checkpoint files
        import tensorflow as tf

        checkpoint = tf.train.latest_checkpoint(os.path.join(path, "checkpoints"))
    return Encoder(truncate(model, feature), feature, kind, path, method_from_flags(saved),
                   checkpoint)
