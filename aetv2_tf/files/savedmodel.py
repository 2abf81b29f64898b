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
from absl import logging

from aetv2_tf.files.provenance import check_export_target, replace_export
from aetv2_tf.files.saving import load_saved_flags
from aetv2_tf.models import BACKBONES, build_backbone


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


def restore_encoder(model_dir: str) -> tuple[keras.Model, dict]:
    """The encoder of the pretraining run in `model_dir` and its flags: its `encoder.weights.h5`,
    else the encoder in its newest `ckpt-*.weights.h5` checkpoint, under TensorFlow with the
    run's `--batch_norm` (fused for runs of other backends), elsewhere with Keras's; a run whose
    checkpoints are `tf.train.Checkpoint` files is read from its newest one under TensorFlow.
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
    if encoder_source(model_dir) is not None or not tensorflow:
        if not tensorflow and (why := tensorflow_run_unreadable(model_dir, saved)) is not None:
            raise ValueError(why)
        tensorflow_run = saved.get("backend", "tensorflow") == "tensorflow"
        batch_norm = "keras" if not tensorflow else \
            saved.get("batch_norm", "fused") if tensorflow_run else "fused"
        return load_encoder_weights(model_dir, saved, batch_norm), saved
    return _restore_tf_checkpoint(model_dir, saved), saved


def _restore_tf_checkpoint(model_dir: str, saved: dict) -> keras.Model:
    """The encoder in the newest `tf.train.Checkpoint` of the run in ``model_dir``, read into
    the model those checkpoints hold (the joint-batch AET model unless ``saved`` says)."""
    import tensorflow as tf

    from aetv2_tf.models import build_aet_model, build_rotation_classifier

    encoder = build_backbone(saved["backbone"], batch_norm=saved["batch_norm"])
    model = build_rotation_classifier(encoder) if saved.get("pretext") == "rotation" else \
        build_aet_model(encoder, siamese_batch_norm=saved.get("siamese_batch_norm", "joint"),
                        one_pass=False)  # the layout of those checkpoints
    latest = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
    if latest is None:
        raise FileNotFoundError(f"no checkpoint in {model_dir}/checkpoints: train first.")
    tf.train.Checkpoint(model=model).read(latest).expect_partial()
    logging.info("Restored the encoder from %s.", latest)
    return encoder
