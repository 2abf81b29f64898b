"""Where the project writes: never through a symbolic link it did not create (library code).

Every file the project writes, truncates, appends to or replaces in a run folder, an export's
parent or a report's `--output` goes through this module:

* `refuse_link`: a UsageError naming the path, where it points and the fix, when the path is a
  symbolic link (or, with ``regular=True``, exists and is not a regular file: a FIFO would block
  the writer, a device would take the bytes). Called before a path is written or moved into;
* `open_for_writing`: the file opened with ``O_NOFOLLOW`` (``w``: truncated, ``a``: appended,
  ``a+``: read and written, neither truncated): a link planted after the check still fails
  (``ELOOP``) instead of being followed;
* `write_atomically`: THE writer of whole files (text, bytes, or what a saver such as Keras's
  ``save_weights`` writes): a temporary beside the file, created by the call itself, flushed to
  the disk, renamed into place, the folder flushed too: a reader never sees a partial file, a
  link at the path is refused, not replaced, and a failed write (a full disk) leaves the old
  file as it was, the temporary removed, the error (its errno) raised as it came;
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
from collections.abc import Callable
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


def write_atomically(path: str | os.PathLike, content: str | bytes | Callable[[str], object],
                     fix: str = LINK_FIX, *,
                     before_replace: Callable[[str], object] | None = None) -> str:
    """Writes the file ``path`` whole or not at all, and returns ``path``.

    ``content``: text (UTF-8), bytes, or a saver ``content(tmp)`` that writes the file at
    ``tmp`` (Keras's ``save_weights``, ``model.save``). It goes to the temporary
    ``.tmp<pid>-<name>`` beside ``path`` (its name ends as ``path``'s: Keras checks suffixes),
    created by this call (``O_EXCL | O_NOFOLLOW``: nothing planted there is followed), flushed
    to the disk (fsync); then ``before_replace(tmp)`` if given (`saving.save_atomically`
    writes the checksum there), ``os.replace`` into place and an fsync of the folder, so that
    the rename survives a crash. A symbolic link (or a FIFO, a folder) at ``path`` or at the
    temporary's name is refused (`refuse_link`). On any error (``ENOSPC`` or ``EFBIG`` of a full
    disk, a saver's failure, an interrupt) the temporary is removed, ``path`` is left as it was,
    and the error is raised as it came (an OSError keeps its errno)."""
    path = os.fspath(path)
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".tmp{os.getpid()}-{name}")
    refuse_link(path, fix, regular=True)
    refuse_link(tmp, fix, regular=True)
    if os.path.lexists(tmp):  # this pid's: a dead process's whose pid came back
        os.remove(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            if not callable(content):
                f.write(content.encode() if isinstance(content, str) else content)
        if callable(content):
            content(tmp)
        _fsync(tmp)
        if before_replace is not None:
            before_replace(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp) and not os.path.islink(tmp):
            os.remove(tmp)
        raise
    _fsync(directory or ".")
    return path


def _fsync(path: str) -> None:
    """Flushes the file or folder at ``path`` to the disk (a file system that cannot flush a
    folder, EINVAL, is left to its own ordering)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != errno.EINVAL or not os.path.isdir(path):
            raise
    finally:
        os.close(fd)


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
