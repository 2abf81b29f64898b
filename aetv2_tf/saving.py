"""An encoder trained in Python, saved as a directory the programs accept, and loaded back.

    aetv2_tf.save_encoder(encoder, "runs/my_encoder", recipe=aetv2_tf.AETV2, dataset="cifar10")
    encoder = aetv2_tf.load_encoder("runs/my_encoder")          # any Keras backend
    python -m aetv2_tf.train --flagfile=configs/cifar10_probe_conv.cfg --pretrained=runs/my_encoder

The directory is what a pretraining run of the command line leaves for its readers:
``encoder.weights.h5`` (the Keras-BatchNorm layout that every backend reads) and ``flags.json``,
a record of what the encoder is (``stage``, ``pretext``, ``loss``, ``backbone``, ``dataset``),
so that ``--pretrained``, ``python -m aetv2_tf.export`` and the report treat it as the encoder
of a pretraining run. Both files are written atomically, with their checksums.
"""

from __future__ import annotations

import json
import os

import keras

from aetv2_tf.program.keras_checkpoints import save_encoder_weights, write_text_atomically
from aetv2_tf.recipes import Recipe


def save_encoder(encoder: keras.Model, directory: str, *, recipe: Recipe | None = None,
                 pretext: str = "aet", dataset: str = "cifar10") -> str:
    """Writes ``encoder`` (a `build_backbone` model, "nin" or "alexnet") to ``directory``.

    ``recipe``: how it was trained (its ``loss`` names the method: geodesic = AETv2, mse =
    AETv1); ``pretext``: "aet" or "rotation" (RotNet); ``dataset``: the training data's name,
    which fixes the normalisation the probes and the export apply ("cifar10": CIFAR-10's mean
    and std; anything else: ImageNet's). Returns ``directory``.
    """
    if encoder.name not in ("nin", "alexnet"):
        raise ValueError(f"save_encoder takes a build_backbone encoder named 'nin' or "
                         f"'alexnet', not {encoder.name!r}")
    if pretext not in ("aet", "rotation"):
        raise ValueError(f"pretext must be 'aet' or 'rotation', got {pretext!r}")
    os.makedirs(directory, exist_ok=True)
    save_encoder_weights(encoder, encoder.name, directory)
    record = {"stage": "pretext", "pretext": pretext, "backbone": encoder.name,
              "dataset": dataset, "batch_norm": "keras", "backend": keras.backend.backend(),
              "loss": (recipe or Recipe()).loss, "saved_by": "aetv2_tf.save_encoder",
              "image_size": int(encoder.input_shape[1])}
    write_text_atomically(os.path.join(directory, "flags.json"),
                          json.dumps(record, indent=2) + "\n")
    return directory


def load_encoder(directory: str, batch_norm: str = "keras") -> keras.Model:
    """The encoder in ``directory``: one written by `save_encoder`, or a pretraining run's
    ``--model_dir`` (its ``encoder.weights.h5``, else its newest checkpoint), on the current
    Keras backend; ``batch_norm``: "keras", or "fused" (TensorFlow's kernel, same weights)."""
    from aetv2_tf.export import load_saved_flags
    from aetv2_tf.program.keras_checkpoints import load_encoder_weights

    if not os.path.isfile(os.path.join(directory, "flags.json")):
        raise FileNotFoundError(f"{directory} has no flags.json: pass a directory written by "
                                "save_encoder or a pretraining run's model_dir")
    return load_encoder_weights(directory, load_saved_flags(directory), batch_norm)
