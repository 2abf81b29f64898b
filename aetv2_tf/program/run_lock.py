"""The lock of a `--model_dir`: one writing process at a time (`lock`), and readers told when
a run is training now (`refuse_training`).
"""

from __future__ import annotations

import os

from aetv2_tf.errors import UsageError
from aetv2_tf.files.safe_paths import open_for_writing

#: How to mend a run folder's part that is a link: the run writes inside its model_dir only.
PART_FIX = ("a run's files and folders are written inside its --model_dir only: remove the link "
            "(what it points to stays as it is; to keep a run on another disk, link the whole "
            "--model_dir instead) or choose a new, empty --model_dir")

LOCK_NAME = ".lock"
_LOCKS: dict[str, object] = {}  # model_dir -> the open lock file this process holds


def lock(model_dir: str) -> None:
    """Takes `<model_dir>/.lock` (an exclusive `flock`, released by the OS when the process
    ends) and writes the pid, host and start time into it; UsageError naming the holder when
    another process holds it, or when it is a link or not a regular file. Idempotent."""
    import fcntl
    import socket
    import time

    key = os.path.realpath(model_dir)
    if key in _LOCKS:
        return
    path = os.path.join(model_dir, LOCK_NAME)
    handle = open_for_writing(path, "a+", PART_FIX)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read(1000).strip() or "another process"  # one line
        handle.close()
        raise UsageError(f"--model_dir={model_dir} is in use by {holder}; wait for it to end "
                         "or stop it (a run stopped by a signal resumes from its checkpoint), "
                         "or choose another --model_dir.") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on host {socket.gethostname()}, since "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    handle.flush()
    _LOCKS[key] = handle


def refuse_training(model_dir: str, what: str) -> None:
    """UsageError when another live process holds `model_dir`'s lock (`what`: how the reader
    names the run, e.g. ``--pretrained=runs/x``); the run's own process and its children (the
    export it starts) read it. A shared `flock` tried; nothing written."""
    import fcntl
    import socket

    path = os.path.join(model_dir, LOCK_NAME)
    if os.path.realpath(model_dir) in _LOCKS or os.path.islink(path) or \
            not os.path.isfile(path):
        return
    with open(path) as handle:  # read-only: a reader never changes the run
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = handle.read(1000).strip() or "another process"  # one line
            if holder.startswith(f"pid {os.getppid()} on host {socket.gethostname()},"):
                return  # the run that started this process
            raise UsageError(f"{what} is a run that is training now ({holder}): its checkpoints "
                             "change while it trains; wait for it to end (or stop it: a run "
                             "stopped by a signal resumes from its checkpoint), then run this "
                             "again.") from None
