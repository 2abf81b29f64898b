"""The lock of a `--model_dir`: one writing process at a time, and readers told when a run is
training now.

`lock` takes ``<model_dir>/.lock`` (an exclusive ``flock``, released by the OS when the process
ends, however it ends) for the process that writes the run (`rundir.prepare`); `refuse_training`
lets a reader (a probe's ``--pretrained``, the export) say that the run it reads is training,
instead of reading checkpoints that change under it.
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
    """Takes `<model_dir>/.lock` for this process (an exclusive `flock`, released by the OS when
    the process ends, however it ends) and writes its pid, host and start time into it; a
    model_dir that another live process holds is refused, naming that process; a lock that is
    a symbolic link or not a regular file is refused (`safe_paths.open_for_writing`), never
    written through. Held until the process exits; taking it again in the same process is a
    no-op."""
    import fcntl
    import socket
    import time

    key = os.path.realpath(model_dir)
    if key in _LOCKS:
        return
    path = os.path.join(model_dir, LOCK_NAME)
    # held open for the life of the process; never through a link (it would be truncated)
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
    """UsageError when another live process holds `model_dir`'s lock (`lock`): a run that is
    training now, whose checkpoints change under a reader (`what`: how the reader names it, e.g.
    ``--pretrained=runs/x``). The run's own process and its children (the export a run starts
    in a child process once it has trained) read it. The lock is read, never created or
    written: a shared `flock` tried and released at once."""
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
