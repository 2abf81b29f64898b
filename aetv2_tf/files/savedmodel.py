"""The encoder as a TensorFlow SavedModel, and the encoder of a pretraining run (library code).

* `export_encoder`: a SavedModel whose ``serving_default`` signature takes uint8 images
  (B, H, W, 3), normalises them inside and returns a dict of float32 feature maps (NIN:
  ``block1``..``block4``; AlexNet: ``conv1``..``conv5``, ``fc6``, ``fc7``), with its manifest
  (`files.provenance`). A TensorFlow tensor of another dtype raises InvalidArgumentError, of
  another size TypeError, one image (H, W, 3) InvalidArgumentError; a NumPy array of another
  dtype is cast to uint8 by TensorFlow first (floats truncated: convert [0, 1] floats with
  ``np.uint8(np.round(x * 255))``).
* `restore_encoder`: the encoder of a pretraining ``--model_dir`` and its flags.

The command line is `aetv2_tf.export` (``python -m aetv2_tf.export --model_dir=RUN``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import keras

from aetv2_tf.files.provenance import check_export_target, replace_export
from aetv2_tf.files.saving import load_saved_flags
from aetv2_tf.models import BACKBONES


def export_encoder(encoder: keras.Model, output: str, dataset: str | None = "cifar10", *,
                   mean: Sequence[float] | None = None,
                   std: Sequence[float] | None = None) -> str:
    """Writes `encoder` as a SavedModel at `output` with a uint8 -> named-features signature
    that normalises ``(u / 255 - mean) / std``: the given ``mean`` and ``std``, else those of
    ``dataset`` ("cifar10", else ImageNet's); returns `output`.

    `output` is replaced only when absent, empty, or a verified previous export
    (`provenance.replace_export`); else `provenance.ExportTargetError` (a ValueError), nothing
    written. RuntimeError under another Keras backend (the SavedModel traces with TensorFlow)."""
    from aetv2_tf.input_checks import require_backend

    require_backend("tensorflow", "export_encoder (a TensorFlow SavedModel)", instead=(
        "aetv2_tf.save_encoder(encoder, DIR, dataset=...) here, then "
        "`KERAS_BACKEND=tensorflow python -m aetv2_tf.export --model_dir=DIR --output=...` "
        "(writes the same SavedModel; default DIR/export/encoder)."))
    import tensorflow as tf

    from aetv2_tf.data.constants import normalization_constants

    check_export_target(output)
    height, width = encoder.input_shape[1:3]
    if (mean is None) != (std is None):
        raise ValueError("export_encoder: pass both mean and std, or neither (dataset's)")
    if mean is None:
        mean, std = normalization_constants(dataset)
    # What a reader needs to rebuild this encoder and read its variables as data (provenance).
    record = dict(name=encoder.name, input_shape=[int(d) for d in encoder.input_shape[1:]],
                  mean=[float(v) for v in mean], std=[float(v) for v in std],
                  shapes=[[int(d) for d in v.shape] for v in encoder.variables],
                  paths=[v.path for v in encoder.variables])
    mean = tf.constant(mean, tf.float32)
    std = tf.constant(std, tf.float32)

    def serve(images):
        # First: an unbatched image (H, W, 3) would reach the oneDNN convolution, whose failed
        # check aborts the process; this raises InvalidArgumentError, naming the shape.
        images = tf.ensure_shape(images, [None, height, width, 3])
        x = (tf.cast(images, tf.float32) / 255.0 - mean) / std
        features = encoder(x, training=False)
        return {name: tf.cast(value, tf.float32) for name, value in features.items()}

    archive = keras.export.ExportArchive()
    archive.track(encoder)
    archive.add_endpoint(
        "serving_default", serve,
        input_signature=[tf.TensorSpec([None, height, width, 3], tf.uint8, name="images")])
    return replace_export(lambda staged: archive.write_out(staged, verbose=False), output,
                          encoder=record)


#: The last commit of this repository whose program resumes a run checkpointed in the
#: `tf.train.Checkpoint` format of aetv2_tf 0.1 (it goes on in `.weights.h5` checkpoints).
TF_CHECKPOINTS_RESUMED_BY = "9bd4fb4"


def restore_encoder(model_dir: str) -> tuple[keras.Model, dict]:
    """The encoder of the pretraining run in `model_dir` and its flags: its `encoder.weights.h5`,
    else the encoder in its newest `ckpt-*.weights.h5` checkpoint, under TensorFlow with the
    run's `--batch_norm` (fused for runs of other backends), elsewhere with Keras's. A run of
    aetv2_tf 0.1 whose checkpoints are all `tf.train.Checkpoint` files is refused (ValueError)
    naming the version that resumes it.
    """
    from aetv2_tf.files.saving import (
        encoder_source,
        load_encoder_weights,
        tensorflow_run_unreadable,
    )

    saved = load_saved_flags(model_dir)
    if saved.get("stage") != "pretext":
        raise ValueError(f"{model_dir} holds a {saved.get('stage')!r} run, not a pretext run.")
    for key, allowed in (("backbone", BACKBONES), ("dataset", None)):
        if not isinstance(saved.get(key), str) or (allowed and saved[key] not in allowed):
            raise ValueError(f"{os.path.join(model_dir, 'flags.json')}: --{key} is "
                             f"{json.dumps(saved.get(key))[:60]}, not what a pretraining run "
                             "records; restore its flags.json.")
    tensorflow = keras.backend.backend() == "tensorflow"
    if not tensorflow and (why := tensorflow_run_unreadable(model_dir, saved)) is not None:
        raise ValueError(why)
    if encoder_source(model_dir) is None and \
            os.path.isfile(os.path.join(model_dir, "checkpoints", "checkpoint")):
        raise ValueError(f"{model_dir} holds tf.train.Checkpoint checkpoints of aetv2_tf 0.1, "
                         "which this version does not read: finish or resume the run with the "
                         "last version that does (git checkout "
                         f"{TF_CHECKPOINTS_RESUMED_BY}), then read its encoder.weights.h5 here.")
    tensorflow_run = saved.get("backend", "tensorflow") == "tensorflow"
    batch_norm = "keras" if not tensorflow else \
        saved.get("batch_norm", "fused") if tensorflow_run else "fused"
    return load_encoder_weights(model_dir, saved, batch_norm), saved
