"""Keras ``.weights.h5`` files written so that a full disk or a file-size limit is an OSError,
never a crash.

``model.save_weights(path)`` writes through HDF5 (h5py), which buffers metadata and small
datasets and writes them when an object or the file is closed. When the disk fills (ENOSPC) or
the file reaches the process's size limit (EFBIG, ``ulimit -f``) during the save, Keras raises
the OSError but the HDF5 file stays open, or half closed: its next close (by the garbage
collector, or when the interpreter exits) writes again, fails again (h5py prints "Can't
decrement id ref count") and the process dies of a segmentation fault, after the program's own
message (exit 139 instead of the documented 5). A failed close leaves HDF5's file handle
dangling, so no clean-up after the fact is safe.

So HDF5 never meets the disk: `save_weights_file` has Keras write the file into memory
(`WeightsImage`: its H5 store takes an ``io.BytesIO``), then writes those bytes with plain
writes, whose ENOSPC or EFBIG is an OSError with its errno and nothing left open; the caller
(`saving.save_atomically`) removes the temporary and the programs map the errno to their exit
code. The cost is the file's size in memory for the length of the write (17 MB for a NIN
checkpoint, about 650 MB for AlexNet with Adam); the file reads back as one written directly.
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
    """The bytes of a ``.weights.h5`` file in memory, as ``model.save_weights`` writes them:
    Keras checks the suffix of ``str(filepath)`` (`name`) and its H5 store writes into an
    ``io.BytesIO``."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def __str__(self) -> str:
        return self.name


def write_bytes(path: str, data: bytes | memoryview) -> None:
    """`data` into a new file at `path` (replaced if it exists), flushed to the disk; a full
    disk or a file-size limit raises OSError (ENOSPC, EFBIG) with the file closed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def save_weights_file(model: Any, path: str,
                      attributes: Mapping[str, int | str] | None = None) -> None:
    """``model.save_weights(path)`` whose full disk or file-size limit is an OSError with its
    errno, nothing of HDF5 left open (module docstring). `attributes`: values stored on the
    file's root beside the weights (`file_attributes` reads them; Keras ignores them), e.g. a
    checkpoint's step."""
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
