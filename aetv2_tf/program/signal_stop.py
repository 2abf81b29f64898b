"""SIGTERM and SIGINT as a clean stop: of a training run after the current step, with a final
checkpoint (`SignalStop`: `run_control.RunControl` applies it, a probe's head after its epoch;
`distribute.signal_agreement` makes the workers of a cluster stop after the same step); of
the other work of a stage (a KNN, an export) at once, keeping nothing of it (`interrupting`).
Either ends in `Interrupted` or an `Outcome`, whose line says where it stopped and how to go on,
exit 128 + N."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator

from absl import logging

#: Sums every worker's received signals: ``(sigint, sigterm) -> (sigint, sigterm)``.
Agreement = Callable[[int, int], tuple[int, int]]


class SignalStop:
    """Turns SIGTERM/SIGINT into a stop at the end of the current step between `install` and
    `restore`; ``received``: the name of the signal that stops the run (None: none).

    A second signal ends the process at once through the previous handler, except while
    ``writing`` is set (a checkpoint is being written). ``agree`` (several workers) sums every
    worker's received signals after each step; only the sums decide, so all stop together."""

    def __init__(self, agree: Agreement | None = None,
                 writing: threading.Event | None = None):
        self.agree = agree
        self.writing = writing or threading.Event()
        self.received: str | None = None
        self._previous: dict[signal.Signals, object] = {}

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handler)

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def _handler(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.received is None:
            self.received = name
            logging.warning("%s received: stopping after this step and writing a checkpoint.",
                            name)
            return
        if self.writing.is_set():
            logging.warning("%s received while a checkpoint is written: stopping once it is "
                            "complete.", name)
            return
        self.restore()  # the impatient second signal: the handler in place before acts
        os.kill(os.getpid(), signum)

    def stops(self) -> bool:
        """After a step: whether training ends now (a signal received here or, with ``agree``,
        by any worker: the sums of the counts sent after this step)."""
        if self.agree is None:
            return self.received is not None
        # The handler may run while `agree` waits for the other workers, after this worker's
        # count was sent: that signal is sent after the next step, and every worker stops then.
        sent = self.received
        sigint, sigterm = self.agree(int(sent == "SIGINT"), int(sent == "SIGTERM"))
        if not (sigint or sigterm):
            return False
        if self.received is None:
            self.received = "SIGTERM" if sigterm else "SIGINT"
            logging.warning("Another worker received %s: stopping after this step and "
                            "writing a checkpoint.", self.received)
        return True


class Interrupted(BaseException):
    """A signal ended a stage ``where`` it says ("during the export: nothing of it was kept;
    ..."): `str` is the program's last line, `exit_code` 128 + N. A BaseException, like
    KeyboardInterrupt: no ``except Exception`` of the work under way takes it for its failure."""

    def __init__(self, signal_name: str, where: str):
        super().__init__(signal_name, where)
        self.exit_code = 128 + signal.Signals[signal_name].value
        self.line = f"Stopped by {signal_name} {where} (exit {self.exit_code})."

    def __str__(self) -> str:
        return self.line


@contextlib.contextmanager
def interrupting(where: str) -> Iterator[None]:
    """Within, SIGTERM and SIGINT raise `Interrupted` ``where`` at once, dropping the work under
    way (its files are whole or absent: `safe_paths.write_atomically`); the handlers before
    are put back after. A `SignalStop` installed inside takes over until it restores them."""
    def stop(signum, frame) -> None:
        raise Interrupted(signal.Signals(signum).name, where)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
