"""The training program: `python -m aetv2_tf.train --flagfile=configs/<experiment>.cfg`.

One absl entry point for every stage (see `aetv2_tf/program/flags/` or `--helpfull`):

- `--stage=pretext`: self-supervised pretraining, AETv2 (`--loss=geodesic`), AETv1
  (`--loss=mse`) or RotNet (`--pretext=rotation`);
- `--stage=probe`: a frozen encoder evaluated by KNN or a trained classifier head;
- `--stage=supervised`: the fully supervised NIN baseline.

Everything a run produces lives under `--model_dir` (layout in `aetv2_tf/program/rundir.py`);
rerunning the same command resumes from the newest checkpoint, at the same step and learning
rate.

This module is only the entry point of the program layer (`aetv2_tf.program`, BUILD.md
"Architecture"): it parses the flags, runs the adapter of the Keras backend, TensorFlow's
(`program.adapter_tensorflow`: tf.distribute, tf.data, TensorBoard, SavedModel) or any other
backend's (`KERAS_BACKEND=jax`: `program.adapter_portable`, which needs no TensorFlow: the
module and `--helpfull` load without it), with the same flags, and turns the outcome into an
exit code.
"""

from __future__ import annotations

import os
import signal
import sys

# A SIGINT before training ends the process at once, as a SIGTERM does (docs/reliability.md),
# until training installs its own handler (`callbacks.StopOnSignal`, which restores this one):
# Python's KeyboardInterrupt waits for the C call under way (importing TensorFlow, reading the
# data, tracing) and ends in a traceback. A SIGINT ignored by the parent stays ignored.
if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, signal.SIG_DFL)

from absl import app

from aetv2_tf.data.sources import DataError
from aetv2_tf.errors import UsageError
from aetv2_tf.program import console
from aetv2_tf.program.flags import FLAGS


def import_backend() -> bool:
    """Imports Keras, and TensorFlow where it is Keras's backend, with their start-up lines
    quieted; True under TensorFlow (other backends run `program.adapter_portable` and never
    import it). Called once the flags have parsed: a command line absl refuses (an unknown or
    invalid flag, `--help`) answers in a fraction of a second, not after ~4 s of imports."""
    with console.quiet_native_stderr(not console.verbose_requested()):
        import keras

        tensorflow = keras.backend.backend() == "tensorflow"
        if tensorflow:
            import tensorflow as tf  # noqa: F401  (imported here, its start-up lines quieted)
    return tensorflow


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}: every option is a --flag.")
    on_tensorflow = import_backend()
    console.configure_logging(FLAGS["verbosity"].present, tensorflow=on_tensorflow)
    from aetv2_tf.program.config import from_flags

    try:  # the flags, read once: nothing reads them after this
        config = from_flags(FLAGS, sys.argv)
    except (UsageError, DataError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    model_dir = config.outputs.model_dir
    if on_tensorflow:
        from aetv2_tf.program import adapter_tensorflow as adapter

        peer_lost = adapter.PEER_LOST
    else:  # KERAS_BACKEND=jax (or another non-TensorFlow backend): the portable program
        from aetv2_tf.program import adapter_portable as adapter

        peer_lost = ()
    try:
        summary = adapter.run(config)
    except (UsageError, DataError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    except peer_lost as e:
        print(f"error: a worker of the cluster stopped answering ({type(e).__name__}: "
              f"{str(e).splitlines()[0]}); stop every worker and start the same commands again: "
              "they resume from the chief's newest checkpoint.", file=sys.stderr, flush=True)
        sys.exit(EXIT_PEER_LOST)
    except OSError as e:
        if not disk_full(e):
            raise
        from aetv2_tf.program.keras_checkpoints import list_checkpoints

        found = list_checkpoints(os.path.join(model_dir, "checkpoints"))
        newest = f"the newest complete checkpoint, {found[-1][1]}, is intact" if found else \
            "no checkpoint was complete yet"
        print(f"error: the disk of --model_dir={model_dir} is full ({e}); {newest}. Free "
              "space (or lower --keep_checkpoints) and rerun the same command to resume.",
              file=sys.stderr, flush=True)
        sys.exit(EXIT_DISK_FULL)
    line = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in summary.items())
    print(f"Done ({config.stage}): {line}. Outputs in {model_dir}", flush=True)
    sys.exit(exit_code(summary, model_dir, config.train.max_loss_growth))


#: Exit codes (docs/reliability.md): 0 done, 1 absl flag errors, 2 refused input, 3 non-finite
#: training, 4 export failed, 5 disk full, 6 a lost worker, 7 the loss grew past
#: --max_loss_growth times its first value (a finite divergence), 128 + N stopped by signal N
#: (SIGTERM 143, SIGINT 130) after a final checkpoint.
EXIT_NONFINITE = 3
EXIT_EXPORT = 4
EXIT_DISK_FULL = 5
EXIT_PEER_LOST = 6
EXIT_LOSS_GREW = 7


def newest_checkpoint(model_dir: str) -> str:
    """The model_dir's newest complete checkpoint, in words: what a stopped run keeps."""
    from aetv2_tf.program.keras_checkpoints import list_checkpoints

    found = list_checkpoints(os.path.join(model_dir, "checkpoints"))
    if not found:
        return "no checkpoint was written (rerunning the command starts again at step 0)"
    return f"the newest checkpoint, {found[-1][1]} (step {found[-1][0]}), holds the last good " \
           "weights"


def disk_full(error: OSError) -> bool:
    """Whether `error` says the disk is full or over quota (h5py puts the errno in the text)."""
    import errno

    return error.errno in (errno.ENOSPC, errno.EDQUOT) or "errno = 28" in str(error) or \
        "No space left on device" in str(error)


def exit_code(summary: dict, model_dir: str = "", max_loss_growth: float = 10.0) -> int:
    """The exit status of a stage's `summary`, with the last line a script needs to act on
    (``model_dir``: the run's, whose newest checkpoint it names; ``max_loss_growth``: the
    factor the loss grew past)."""
    kept = newest_checkpoint(model_dir)
    if summary.get("interrupted_by"):
        sig = signal.Signals[summary["interrupted_by"]]
        print(f"Stopped by {sig.name} at step {summary.get('steps')} after writing a checkpoint: "
              f"the run is NOT finished; rerun the same command to resume (exit "
              f"{128 + sig.value}).", flush=True)
        return 128 + sig.value
    if summary.get("diverged"):
        print(f"error: training diverged (every step non-finite); {kept}. Lower "
              "--learning_rate or add --warmup_steps.", file=sys.stderr)
        return EXIT_NONFINITE
    if summary.get("nonfinite_weights"):
        print("error: non-finite weights (e.g. NaN images made the BatchNorm statistics NaN): "
              f"no checkpoint was written for them and training stopped; {kept}. "
              "Check the data, lower --learning_rate.", file=sys.stderr)
        return EXIT_NONFINITE
    if summary.get("loss_grew"):
        print(f"error: training diverged: the loss grew to {summary['loss_grew']}, past "
              f"--max_loss_growth={max_loss_growth:g}; no checkpoint was "
              f"written for these weights and training stopped; {kept}. Lower "
              "--learning_rate or add --warmup_steps (--max_loss_growth=0 turns the check "
              "off).", file=sys.stderr)
        return EXIT_LOSS_GREW
    if summary.get("export_failed"):
        print(f"error: training finished (the encoder is in {model_dir}/encoder.weights.h5) "
              f"but the SavedModel export failed (the log says why); export it with python -m "
              f"aetv2_tf.export --model_dir={model_dir}.", file=sys.stderr)
        return EXIT_EXPORT
    if summary.get("stopped_nonfinite"):
        print(f"error: --on_nonfinite=stop ended training at a non-finite step; "
              f"{kept}. Lower --learning_rate, add --warmup_steps, or pass "
              "--on_nonfinite=skip.", file=sys.stderr)
        return EXIT_NONFINITE
    return 0


if __name__ == "__main__":
    app.run(main)
