"""A quiet console for the command-line programs (`python -m aetv2_tf.train`, `.export`).

By default the console shows the program's own lines (the start line, the progress bar, the end
summary) and real problems (WARNING and above), not the chatter of the libraries underneath:
TensorFlow's native start-up lines (printed before its logging is configured, so they can only be
silenced at the file-descriptor level while it loads), INFO logs, and the warnings Keras and
TensorFlow repeat at every `fit` or export. `--verbosity=0` (absl's flag: 0 INFO, 1+ debug)
brings everything back; so does `AETV2_VERBOSE=1` for the import itself.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

# Warnings that say nothing to a user of this program (each repeated at every fit/export).
_NOISE = (
    r"`shuffle=True` was passed, but will be ignored",  # our tf.data streams are pre-shuffled
    r".*triggered tf\.function retracing",
)


def verbose_requested(argv: list[str] | None = None) -> bool:
    """True when the command line asks for library logs (`--verbosity`/`-v`, `AETV2_VERBOSE`)."""
    argv = sys.argv if argv is None else argv
    return os.environ.get("AETV2_VERBOSE", "") not in ("", "0") or any(
        a == "-v" or a.startswith(("--verbosity", "-v=")) for a in argv[1:])


@contextlib.contextmanager
def quiet_native_stderr(enabled: bool = True):
    """Sends file descriptor 2 to /dev/null inside the block (native libraries' start-up lines).

    Python-level errors raised inside still propagate and are printed after the block.
    """
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def configure_logging(verbose: bool, tensorflow: bool = True) -> None:
    """absl/TensorFlow logs at WARNING and known noise filtered, unless `verbose`.

    `tensorflow=False` (another Keras backend) leaves TensorFlow alone (it is not imported)."""
    from absl import logging

    if verbose:
        return
    logging.set_verbosity(logging.WARNING)
    if tensorflow:
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")  # its python-side INFO and retracing notices
    for pattern in _NOISE:
        warnings.filterwarnings("ignore", message=pattern)
