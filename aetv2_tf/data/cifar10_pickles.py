"""CIFAR-10's python batches read without trusting them: no code runs, no memory beyond the file.

A plain ``pickle.load`` runs whatever a crafted file names, and numpy's own reconstructors
allocate what the file asks before anything checks it (a 217-byte pickle can ask for 10 GB).
`unpickle_batch` (docs/reliability.md, "Trust: hostile and oversized inputs"):

* refuses unread a file over `MAX_BATCH_FILE_BYTES` and reads a smaller one whole. CPython's C
  unpickler still allocates a bytes object of the length a BINBYTES8 opcode declares before
  reading into it: 1 TB is a MemoryError, less is address space never touched, then "pickle data
  was truncated" (`sources.load_cifar10` makes either a DataError naming the file);
* admits only the globals of a numpy array pickle, as checked stand-ins: ``ndarray`` an inert
  token only ``_reconstruct`` accepts, ``_reconstruct`` allocating nothing, ``dtype`` only plain
  numeric types of at most 8 bytes;
* builds an array only from a state holding exactly ``prod(shape) * itemsize`` bytes, as a view
  of them (``np.frombuffer``), so no array is larger than the file.

The caller bounds what it does with the objects: `sources.load_cifar10` checks the labels list
before any conversion (12,000 references to one 1 MB bytes object would be 12 GB as an array).
"""

from __future__ import annotations

import io
import math
import os
import pathlib
import pickle
from typing import Any

import numpy as np

MAX_BATCH_FILE_BYTES = 256 * 2**20
"""The largest CIFAR-10 batch file read (an official batch is 31 MB: 10,000 x 3,072 bytes)."""

_NUMERIC_KINDS = "biuf"
_MAX_DIMS = 32


class _Inert:
    """A global a pickle may name but not change: a BUILD on it (which would otherwise set its
    attributes, for every later read in the process) is refused."""

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        raise pickle.UnpicklingError(f"refused state for {type(self).__name__}")


class _ArrayType(_Inert):
    """Stands for ``numpy.ndarray`` inside a pickle: accepted by `_reconstruct`, nothing else."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise pickle.UnpicklingError("refused call of numpy.ndarray(...): it allocates what the "
                                     "file asks; numpy's own pickles never call it")


_ARRAY_TYPE = _ArrayType()


def _text(value: Any, what: str, limit: int = 8) -> str:
    """A short str or bytes (Python 2 pickles give bytes) as str; UnpicklingError otherwise."""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if not isinstance(value, str) or len(value) > limit:
        raise pickle.UnpicklingError(f"{what} {value!r:.40} is not a short string")
    return value


class _Dtype:
    """A plain numeric numpy dtype named in a pickle; its byte order is set by its state."""

    def __init__(self, spec: Any, align: Any = False, copy: Any = False) -> None:
        dtype = np.dtype(_text(spec, "dtype"))
        if dtype.kind not in _NUMERIC_KINDS or dtype.itemsize > 8:
            raise pickle.UnpicklingError(
                f"refused dtype {dtype}: a CIFAR-10 batch holds only numeric arrays")
        self.dtype = dtype

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, tuple) or len(state) < 5 or any(v is not None
                                                                 for v in state[2:5]):
            raise pickle.UnpicklingError(
                "refused dtype state with fields or sub-arrays: a CIFAR-10 batch holds only "
                "plain numeric arrays")
        order = _text(state[1], "byte order", 1)
        if order not in "<>|=":
            raise pickle.UnpicklingError(f"unknown byte order {order!r}")
        if order in "<>":
            self.dtype = self.dtype.newbyteorder(order)


class _Array:
    """The placeholder `_reconstruct` returns; the array is built by its pickled state."""

    def __init__(self) -> None:
        self.array: np.ndarray | None = None

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 5:
            state = state[1:]  # (version, shape, dtype, is_fortran, data)
        if not isinstance(state, tuple) or len(state) != 4:
            raise pickle.UnpicklingError("an array state that is not (shape, dtype, order, data)")
        shape, dtype, fortran, data = state
        if (not isinstance(shape, tuple) or len(shape) > _MAX_DIMS
                or not all(type(n) is int and n >= 0 for n in shape)):
            raise pickle.UnpicklingError(f"an array shape that is not a tuple of sizes: "
                                         f"{shape!r:.60}")
        if not isinstance(dtype, _Dtype):
            raise pickle.UnpicklingError("an array whose dtype is not a numpy dtype")
        if not isinstance(data, (bytes, bytearray)):
            raise pickle.UnpicklingError(
                f"an array whose data is {type(data).__name__}, not bytes (object arrays are "
                "refused)")
        nbytes = math.prod(shape) * dtype.dtype.itemsize
        if nbytes != len(data):
            raise pickle.UnpicklingError(
                f"an array of shape {shape} {dtype.dtype} ({nbytes:,} bytes) with "
                f"{len(data):,} bytes of data")
        self.array = np.frombuffer(data, dtype.dtype).reshape(shape,
                                                              order="F" if fortran else "C")


class _Reconstruct(_Inert):
    """numpy's ``_reconstruct(ndarray, (0,), b'b')``, checked, allocating nothing."""

    def __call__(self, cls: Any, shape: Any, dtype: Any) -> _Array:
        if cls is not _ARRAY_TYPE:
            raise pickle.UnpicklingError("_reconstruct of something else than numpy.ndarray")
        _text(dtype, "dtype")
        if not isinstance(shape, tuple) or not all(type(n) is int for n in shape):
            raise pickle.UnpicklingError(f"_reconstruct with the shape {shape!r:.60}")
        return _Array()


_reconstruct = _Reconstruct()
_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): _ARRAY_TYPE,
    ("numpy", "dtype"): _Dtype,
}


class RestrictedUnpickler(pickle.Unpickler):
    """Admits only the (checked stand-ins of the) numpy array globals; anything else is
    refused before it is called."""

    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED_GLOBALS.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(
                f"refused global {module}.{name}: a CIFAR-10 batch holds only numpy arrays"
            )
        return found


def _resolve(value: Any) -> Any:
    """A placeholder -> its array (UnpicklingError if it was never built); else ``value``."""
    if isinstance(value, _Array):
        if value.array is None:
            raise pickle.UnpicklingError("an array without its data")
        return value.array
    return value


def unpickle_batch(path: pathlib.Path) -> Any:
    """The object pickled in ``path`` (Python 2 strings as bytes; module docstring): a dict's
    values and a top-level array as numpy arrays, deeper arrays as placeholders. Raises OSError,
    ValueError (over `MAX_BATCH_FILE_BYTES`), pickle.UnpicklingError (refused) or the errors of
    a truncated or corrupt pickle (EOFError, TypeError, ...)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_BATCH_FILE_BYTES:
            raise ValueError(f"the file has {size:,} bytes, over the {MAX_BATCH_FILE_BYTES:,} "
                             "read (an official CIFAR-10 batch has 31,035,704)")
        data = f.read(size)  # (read(n) allocates n bytes first: n is the file's size)
    obj = RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load()
    if isinstance(obj, dict):
        return {key: _resolve(value) for key, value in obj.items()}
    return _resolve(obj)
