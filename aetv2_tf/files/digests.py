"""SHA-256 digests: one function (`sha256`, over a stream of byte blocks) for everything the
project digests: files (`file_digest`), numpy arrays (`arrays_digest`) and a model's variables
(`weights_digest`). Their values are stored and compared (checksums, manifests, presets, the
``trainable_digest`` a run prints), so they do not change. No TensorFlow or Keras at import.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable

import numpy as np

BLOCK = 2**20  # bytes read at once from a file


def sha256(blocks: Iterable[bytes]) -> str:
    """The SHA-256 (64 hex digits) of the concatenation of ``blocks``, fed one at a time."""
    digest = hashlib.sha256()
    for block in blocks:
        digest.update(block)
    return digest.hexdigest()


def file_digest(path: str | os.PathLike) -> str:
    """The SHA-256 (hex) of the file at ``path``, read in blocks of `BLOCK` bytes."""
    with open(path, "rb") as f:
        return sha256(iter(lambda: f.read(BLOCK), b""))


def arrays_digest(arrays: Iterable[np.ndarray]) -> str:
    """A short SHA-256 (its first 16 hex digits) of numpy arrays' C-order bytes, in order."""
    return sha256(np.ascontiguousarray(a).tobytes() for a in arrays)[:16]


def weights_digest(variables) -> str:
    """`arrays_digest` of the variables' values (in order): equal digests mean bitwise-equal
    weights. Any backend; under TensorFlow distributed variables included."""
    import keras

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return arrays_digest(tf.convert_to_tensor(v).numpy() for v in variables)
    return arrays_digest(keras.ops.convert_to_numpy(v) for v in variables)
