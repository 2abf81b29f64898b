"""Where the project writes: never through a symbolic link it did not create (library code).

Every file the project writes, truncates, appends to or replaces in a run folder, an export's
parent or a report's `--output` goes through this module:

* `refuse_link`: a UsageError naming the path, where it points and the fix, when the path is a
  symbolic link (or, with ``regular=True``, exists and is not a regular file: a FIFO would block
  the writer, a device would take the bytes). Called before a path is written or moved into;
* `open_for_writing`: the file opened with ``O_NOFOLLOW`` (``w``: truncated, ``a``: appended,
  ``a+``: read and written, neither truncated): a link planted after the check still fails
  (``ELOOP``) instead of being followed;
* `write_text_atomically`: a text file written under a temporary name beside it (opened as
  above), flushed to the disk and renamed into place: a reader never sees a partial file, and a
  link at the path is refused, not replaced;
* `process_alive`: whether the process whose pid names a temporary still runs (a killed
  process's temporaries are removed by the next writer, a live one's never).

The folder given by the user (``--model_dir``, the folders above it) may be or contain links
(a run on another disk): what is refused is a link INSIDE what the project writes, e.g.
``<model_dir>/.lock``, ``checkpoints/`` or ``results.json``, which would make it write into a
file it did not create. Nothing here imports TensorFlow or Keras.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import IO

from aetv2_tf.errors import UsageError

_FLAGS = {"w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
          "a+": os.O_RDWR | os.O_CREAT}
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
LINK_FIX = ("remove the link (what it points to stays as it is), or choose another folder; the "
            "project writes only files it created itself")


def refuse_link(path: str | os.PathLike, fix: str = LINK_FIX, *, regular: bool = False) -> None:
    """UsageError when `path` is a symbolic link (the message names its target) or, with
    `regular`, exists and is not a regular file; nothing happens for a missing path."""
    path = os.fspath(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise UsageError(f"{path} is a symbolic link (to {os.readlink(path)}) where the project "
                         f"writes; nothing was written through it; {fix}.")
    if regular and not stat.S_ISREG(mode):
        raise UsageError(f"{path} is not a regular file (a folder, FIFO or device) where the "
                         f"project writes a file; nothing was written; {fix}.")


def open_for_writing(path: str | os.PathLike, mode: str = "w", fix: str = LINK_FIX) -> IO[str]:
    """`path` opened as text for writing (`mode` "w", "a" or "a+"), never through a symbolic
    link: `refuse_link` first, then ``O_NOFOLLOW``, so a link appearing in between fails too."""
    path = os.fspath(path)
    refuse_link(path, fix, regular=True)
    try:
        fd = os.open(path, _FLAGS[mode] | _NOFOLLOW, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UsageError(f"{path} is a symbolic link where the project writes; nothing was "
                             f"written through it; {fix}.") from e
        raise
    return os.fdopen(fd, "r+" if mode == "a+" else mode)


def write_text_atomically(path: str | os.PathLike, text: str | bytes,
                          fix: str = LINK_FIX) -> None:
    """`text` (or bytes) into `path`: a temporary beside it (`open_for_writing`), fsync, then
    ``os.replace``; a link at `path` (or at the temporary's name) is refused (`refuse_link`)."""
    path = os.fspath(path)
    refuse_link(path, fix, regular=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open_for_writing(tmp, "w", fix) as f:
            if isinstance(text, bytes):
                f.flush()
                f.buffer.write(text)
            else:
                f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:  # a full disk, a file-size limit: the temporary goes, `path` stays as it was
        if os.path.isfile(tmp) and not os.path.islink(tmp):
            os.remove(tmp)
        raise


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (this process counts as dead: its own earlier
    temporaries are leftovers)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
