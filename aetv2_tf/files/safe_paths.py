"""Where the project writes: never through a symbolic link it did not create (library code).

Every file the project writes goes through `refuse_link`, `open_for_writing` or
`write_atomically` (THE writer of whole files); what it reads back whole goes through
`read_regular_file` (a FIFO or device refused, a file over a limit unread). The user's folder
(``--model_dir`` and above) may be a link; a link INSIDE what the project writes is refused.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable
from typing import IO, Any

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
    """`path` opened as text for writing (`mode` "w", "a" or "a+": read and written, not
    truncated), never through a symbolic link: `refuse_link`, then ``O_NOFOLLOW``."""
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

    ``content``: text (UTF-8), bytes, or a saver ``content(tmp)`` (Keras's ``save_weights``).
    It goes to the temporary ``.tmp<pid>-<name>`` beside ``path`` (``O_EXCL | O_NOFOLLOW``),
    fsynced; then ``before_replace(tmp)`` if given, ``os.replace`` and an fsync of the folder.
    A link, FIFO or folder at either name is refused (`refuse_link`). On any error the
    temporary is removed, ``path`` left as it was, and the error raised as it came."""
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
    """Flushes the file or folder at ``path`` to the disk (a folder's EINVAL is ignored)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != errno.EINVAL or not os.path.isdir(path):
            raise
    finally:
        os.close(fd)


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (this process counts as dead)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: The most bytes of a file read whole (`read_regular_file`); the records hold a few KB.
MAX_RECORD_BYTES = 2**20
READ_FIX = "pass the file this project wrote (or a text file of your own), not this one"


def _refuse_unless_regular(path: str, mode: int, fix: str) -> None:
    if not stat.S_ISREG(mode):
        kind = ("a folder" if stat.S_ISDIR(mode) else
                "a FIFO, whose reader waits for a writer" if stat.S_ISFIFO(mode) else
                "a device, whose bytes may never end" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "not a file")
        raise UsageError(f"{path}: not a regular file ({kind}); {fix}")


def read_regular_file(path: str | os.PathLike, fix: str = READ_FIX,
                      max_bytes: int = MAX_RECORD_BYTES) -> bytes:
    """The bytes of the regular file `path` (links followed) of at most `max_bytes`, else a
    UsageError naming it, what it is and `fix`; checked by ``stat`` and, opened ``O_NONBLOCK``,
    by ``fstat``. An OSError (missing, no permission) is the caller's."""
    path = os.fspath(path)
    _refuse_unless_regular(path, os.stat(path).st_mode, fix)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as handle:
        _refuse_unless_regular(path, os.fstat(fd).st_mode, fix)
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UsageError(f"{path}: larger than {max_bytes} bytes; {fix}")
    return data


def read_json(path: str | os.PathLike, fix: str = READ_FIX) -> Any:
    """The JSON value of the UTF-8 file `path` (`read_regular_file`); ValueError for what is
    not JSON, UsageError for a deep nesting."""
    try:
        return json.loads(read_regular_file(path, fix).decode("utf-8"))
    except RecursionError:
        raise UsageError(f"{os.fspath(path)}: JSON nested too deeply; {fix}") from None
