"""CIFAR-10's python batches read without trusting them: no code runs, no memory beyond the file.

A plain ``pickle.load`` runs whatever a crafted file names, and even numpy's own reconstructors
allocate what the file asks before anything checks it: a 217-byte pickle calling
``numpy.core.multiarray._reconstruct(ndarray, (10**10,), b'b')`` asks for 10 GB. So
`unpickle_batch`:

* refuses unread a file over `MAX_BATCH_FILE_BYTES`, and reads a smaller one whole into memory.
  That bounds the file, not what its string opcodes declare: CPython's C unpickler reads a
  str (BINUNICODE*, BINSTRING*) before making the object (a length beyond the file's end is then
  "pickle data was truncated", no allocation), but allocates a bytes or bytearray object
  (BINBYTES, BINBYTES8, BYTEARRAY8: protocols 3 to 5) of the declared length (up to 2**63 - 1)
  BEFORE reading into it. A 14-byte BINBYTES8 pickle asking for 1 TB thus raises
  MemoryError (malloc refuses it), which `sources.load_cifar10` turns into a DataError naming
  the file (exit 2); one asking for less than the machine's memory (8 GB) gets address space
  that is never touched, since only the file's bytes are copied into it, then the "truncated"
  UnpicklingError (a DataError too). Resident memory stays bounded by the file; under strict
  overcommit (``vm.overcommit_memory=2``) or a ``ulimit -v``, such an allocation is a
  MemoryError instead;
* admits only the globals of a numpy array pickle (``_reconstruct``, ``ndarray``, ``dtype``,
  from numpy 1 or 2 module paths), and none of them is the real one: ``ndarray`` is an inert
  token that only ``_reconstruct`` accepts, ``_reconstruct`` allocates nothing and returns a
  placeholder, ``dtype`` admits only plain numeric types (bool, integers, floats of at most 8
  bytes; no objects, records or sub-arrays);
* builds each array from its pickled state only when the bytes it holds are exactly
  ``prod(shape) * itemsize`` (``np.frombuffer``: a view of those bytes, no copy). So every array
  is at most as large as the file, and arrays that share one bytes object (memo references)
  share its memory.

The rest of a pickle (lists, dicts, bytes, ints, memo references) costs memory in proportion
to the file. What the caller then does with the objects is its own bound: `sources.load_cifar10`
takes the images only as an array, and the labels only as an array or a list of ints with one
per image, checked before any conversion (a list of 12,000 references to one 1 MB bytes object,
passed to ``np.asarray``, would ask for 12 GB).
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
    """The object pickled in ``path`` (Python 2 strings as bytes), read as the module docstring
    says; a dict's values and a top-level array are numpy arrays, deeper arrays stay
    placeholders (a CIFAR-10 batch has none). Raises OSError (unreadable), ValueError (over
    `MAX_BATCH_FILE_BYTES`), pickle.UnpicklingError (refused) or the errors of a truncated or
    corrupt pickle (EOFError, TypeError, ...)."""
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
