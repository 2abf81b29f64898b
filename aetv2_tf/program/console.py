"""A quiet console for the command-line programs: the program's own lines and WARNING and
above, not the libraries' start-up lines, INFO logs and repeated warnings. `--verbosity=0`
(absl's flag) or `AETV2_VERBOSE=1` brings everything back.
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
    """Sends file descriptor 2 to /dev/null inside the block (native libraries' start-up
    lines); Python errors raised inside still propagate."""
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
    """absl/TensorFlow logs at WARNING and known noise filtered, unless `verbose`;
    `tensorflow=False` leaves TensorFlow unimported."""
    from absl import logging

    if verbose:
        return
    logging.set_verbosity(logging.WARNING)
    if tensorflow:
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")  # its python-side INFO and retracing notices
    for pattern in _NOISE:
        warnings.filterwarnings("ignore", message=pattern)
