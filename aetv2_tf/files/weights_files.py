"""Keras ``.weights.h5`` files whose full disk or file-size limit is an OSError, never a crash.

HDF5 left open after a failed write crashes at its next close (docs/reliability.md), so HDF5
never meets the disk: `save_weights_file` has Keras write the file into memory (`WeightsImage`),
then writes those bytes with plain writes (ENOSPC, EFBIG: an OSError with nothing left open).
The cost is the file's size in memory for the length of the write.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np


def variables_bytes(variables: Iterable[Any]) -> int:
    """Bytes that `variables` take in a `.weights.h5` file (their shapes x dtype sizes)."""
    return sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in variables)


class WeightsImage(io.BytesIO):
    """A ``.weights.h5`` file in memory: Keras checks the suffix of ``str(filepath)`` (`name`)
    and its H5 store writes into an ``io.BytesIO``."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def __str__(self) -> str:
        return self.name


def write_bytes(path: str, data: bytes | memoryview) -> None:
    """`data` into the file at `path` (replaced if it exists; `safe_paths.write_atomically`,
    the caller, flushes it to the disk); a full disk or a file-size limit raises OSError
    (ENOSPC, EFBIG) with the file closed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def save_weights_file(model: Any, path: str,
                      attributes: Mapping[str, int | str] | None = None) -> None:
    """``model.save_weights(path)`` through memory (module docstring). `attributes`: values on
    the file's root (`file_attributes` reads them; Keras ignores them), e.g. a checkpoint's step."""
    image = WeightsImage(os.path.basename(path))
    model.save_weights(image)
    if attributes:
        import h5py

        with h5py.File(image, "a") as f:
            f.attrs.update(attributes)
    with image.getbuffer() as data:
        write_bytes(path, data)


def file_attributes(path: str) -> dict[str, Any]:
    """The root attributes of the HDF5 file at `path` (`save_weights_file`'s `attributes`);
    OSError when it cannot be read as HDF5."""
    import h5py

    with h5py.File(path, "r") as f:
        return {key: value.item() if hasattr(value, "item") else value
                for key, value in f.attrs.items()}
