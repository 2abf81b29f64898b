"""The training program: pretraining, probes and the supervised baseline, in one command.

    python -m aetv2_tf.train --flagfile=configs/quickstart.cfg        # a first pretraining
    python -m aetv2_tf.train --flagfile=configs/cifar10_aetv2.cfg --batch_size=256
    python -m aetv2_tf.train --flagfile=configs/cifar10_probe_knn.cfg \\
        --pretrained=runs/quickstart --model_dir=runs/quickstart_knn     # score an encoder

--stage=pretext pretrains AETv2 (--loss=geodesic), AETv1 (--loss=mse) or RotNet
(--pretext=rotation); --stage=probe scores a frozen encoder (KNN or a trained head);
--stage=supervised trains the supervised NIN baseline. A flag after --flagfile overrides the
file's. Everything a run writes is in --model_dir; rerunning the same command resumes the run
(or says that it is complete). Exit codes: docs/reliability.md.

The essential flags, by purpose (each described below; --helpfull lists every flag by group):
"""
# This module is only the entry point of the program layer (`aetv2_tf.program`, BUILD.md
# "Architecture"): it parses the flags, runs the program (`program.stages.run`) with the part of
# the Keras backend, TensorFlow's (`program.tensorflow_backend`: tf.distribute, tf.data,
# TensorBoard, SavedModel) or any other backend's (`KERAS_BACKEND=jax`:
# `program.keras_native_backend`, which needs no TensorFlow: the module and `--helpfull` load
# without it), with the same flags, and turns the outcome into an exit code. Its docstring is
# what `--help` prints (absl), followed by `KEY_FLAGS`.

from __future__ import annotations

import errno
import os
import signal
import sys
from typing import TYPE_CHECKING

# A SIGINT before training ends the process at once, as a SIGTERM does (docs/reliability.md),
# until training installs its own handler (`signal_stop.SignalStop`, which restores this one):
# Python's KeyboardInterrupt waits for the C call under way (importing TensorFlow, reading the
# data, tracing) and ends in a traceback. A SIGINT ignored by the parent stays ignored.
if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, signal.SIG_DFL)

from absl import app, flags

from aetv2_tf.data.sources import DataError
from aetv2_tf.errors import UsageError
from aetv2_tf.program import console
from aetv2_tf.program.flags import FLAGS, parse_command_line
from aetv2_tf.program.signal_stop import Interrupted

#: The flags that ``--help`` (and ``--helpshort``) describe, by purpose: the README's.
KEY_FLAGS = (
    ("what to run", ("flagfile", "stage", "probe", "feature")),
    ("the data", ("dataset", "data_dir")),
    ("the encoder", ("backbone", "pretrained")),
    ("how long", ("batch_size", "epochs", "train_steps", "train_seconds")),
    ("the optimizer", ("learning_rate",)),
    ("what it writes", ("model_dir", "export")),
)
for _, _names in KEY_FLAGS:
    for _name in _names:
        flags.declare_key_flag(_name)
__doc__ += "".join(f"  {group + ':':16}{' '.join('--' + n for n in names)}\n"
                   for group, names in KEY_FLAGS)
del _, _names, _name

if TYPE_CHECKING:
    from aetv2_tf.program.backend import Backend
    from aetv2_tf.program.config import RunConfig
    from aetv2_tf.program.run_control import StageResult


def import_backend() -> bool:
    """Imports Keras, and TensorFlow where it is Keras's backend, with their start-up lines
    quieted; True under TensorFlow (other backends run `program.keras_native_backend` and
    never import it). Called once the flags have parsed: a command line absl refuses (an unknown or
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
    from aetv2_tf.program import stages
    from aetv2_tf.program.config import from_flags
    from aetv2_tf.program.run_control import NothingLearned
    from aetv2_tf.program.rundir import check_apart

    if on_tensorflow:
        from aetv2_tf.program.tensorflow_backend import TensorFlowBackend

        backend_type: type[Backend] = TensorFlowBackend
    else:  # KERAS_BACKEND=jax (or another non-TensorFlow backend): the Keras-native program
        from aetv2_tf.program.keras_native_backend import KerasNativeBackend

        backend_type = KerasNativeBackend
    try:
        config = from_flags(FLAGS, sys.argv)  # the flags, read once: nothing reads them after
        check_apart(config.outputs.model_dir, config.data.data_dir, config.probe.pretrained)
        result = stages.run(config, backend_type)  # (check_apart: before any data is read)
    except (UsageError, DataError, FileNotFoundError, NothingLearned) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(EXIT_NOTHING_LEARNED if isinstance(e, NothingLearned) else 2)
    except Interrupted as stop:  # a stage's own stop: where, and how to go on
        print(stop, flush=True)
        sys.exit(stop.exit_code)
    except backend_type.peer_lost as e:
        print(f"error: a worker of the cluster stopped answering ({type(e).__name__}: "
              f"{str(e).splitlines()[0]}); stop every worker and start the same commands again: "
              "they resume from the chief's newest checkpoint.", file=sys.stderr, flush=True)
        sys.exit(EXIT_PEER_LOST)
    except OSError as e:
        if e.errno not in DISK_FULL:
            raise
        print(f"error: {disk_full(config.outputs.model_dir, e)}", file=sys.stderr, flush=True)
        sys.exit(EXIT_DISK_FULL)
    print(report(config, result), flush=True)
    sys.exit(exit_code(result, config.outputs.model_dir, config.train.max_loss_growth))


def report(config: RunConfig, result: StageResult) -> str:
    """The stage's last line(s) before `exit_code`'s: ``Done (stage): k=v, .... Outputs in
    DIR`` for a stage that ran to its end (`Outcome.finished`); ``Stopped (stage) at step S of
    M: k=v, ...`` for any other pretraining (a signal, a stop flag, a failure: the next line says
    which),
    with, after ``--stop_after_steps`` / ``--stop_after_seconds``, the line that says the run
    goes on when rerun; for a run that had finished before (`pretext_stage.completed`), that it
    is complete and where its outputs are."""
    from aetv2_tf.program.run_control import Ending

    model_dir, summary, outcome = config.outputs.model_dir, result.summary, result.outcome
    if result.finished_before:
        export = f"; its SavedModel: {summary['export']}" if "export" in summary else ""
        return (f"Complete: the run in {model_dir} finished all its {summary['steps']} steps "
                f"before; nothing was trained, exported or scored now. Its encoder: "
                f"{summary['encoder_weights']}{export}; its logs: {model_dir}/train. To train "
                f"it again from step 0 pass --overwrite; to evaluate it, --stage=probe "
                f"--pretrained={model_dir} --model_dir=<a new folder>.")
    line = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in summary.items())
    if outcome is None or outcome.finished:
        return f"Done ({config.stage}): {line}. Outputs in {model_dir}"
    step, total = outcome.step, outcome.steps
    text = f"Stopped ({config.stage}) at step {step} of {total}: {line}. Outputs in {model_dir}"
    if outcome.ending in (Ending.STOP_AFTER_STEPS, Ending.STOP_AFTER_SECONDS):  # exit 0
        which = f"--stop_after_seconds={config.train.stop_after_seconds:g}" \
            if outcome.ending is Ending.STOP_AFTER_SECONDS else \
            f"--stop_after_steps={config.train.stop_after_steps}"
        text += (f"\nThe run is not finished: {which} ended this invocation at step {step} of "
                 f"{total}, after writing a checkpoint; rerun the same command to continue.")
    return text


#: Exit codes (docs/reliability.md): 0 done, 1 absl flag errors, 2 refused input, 3 non-finite
#: training, 4 export failed, 5 disk full (or a file over the file-size limit), 6 a lost worker,
#: 7 the loss grew past --max_loss_growth times its first value (a finite divergence), 8 steps
#: ran but changed no trainable weight, 128 + N stopped by signal N (SIGTERM 143, SIGINT 130)
#: after a final checkpoint.
EXIT_NONFINITE = 3
EXIT_EXPORT = 4
EXIT_DISK_FULL = 5
EXIT_PEER_LOST = 6
EXIT_LOSS_GREW = 7
EXIT_NOTHING_LEARNED = 8
#: The errors of a write that found no room: a full disk, a full quota, the file-size limit.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def disk_full(model_dir: str, error: OSError) -> str:
    """What a write that found no room (`DISK_FULL`) means for the run, and its fix."""
    from aetv2_tf.program.keras_checkpoints import list_checkpoints

    found = list_checkpoints(os.path.join(model_dir, "checkpoints"))
    newest = f"the newest complete checkpoint, {found[-1][1]}, is intact" if found else \
        "no checkpoint was complete yet"
    where = "reached the file-size limit (ulimit -f)" if error.errno == errno.EFBIG else \
        "is full"
    return (f"the disk of --model_dir={model_dir} {where} ({error}); {newest}. Free space (or "
            "lower --keep_checkpoints) and rerun the same command to resume.")


def newest_checkpoint(model_dir: str) -> str:
    """The model_dir's newest complete checkpoint, in words: what a stopped run keeps."""
    from aetv2_tf.program.keras_checkpoints import list_checkpoints

    found = list_checkpoints(os.path.join(model_dir, "checkpoints"))
    if not found:
        return "no checkpoint was written (rerunning the command starts again at step 0)"
    return f"the newest checkpoint, {found[-1][1]} (step {found[-1][0]}), holds the last good " \
           "weights"


def exit_code(result: StageResult, model_dir: str = "", max_loss_growth: float = 10.0) -> int:
    """The exit status of a stage's ``result`` (its outcome's `run_control.Ending`, a failed
    export), with the last line a script needs to act on (``model_dir``: the run's, whose
    newest checkpoint it names; ``max_loss_growth``: the factor the loss grew past)."""
    from aetv2_tf.program.run_control import UNCHANGED_WEIGHTS, Ending

    outcome = result.outcome
    ending = outcome.ending if outcome is not None else Ending.COMPLETED
    if ending is Ending.SIGNAL:
        sig = signal.Signals[outcome.signal]
        print(f"Stopped by {sig.name} at step {outcome.step} after writing a checkpoint: the "
              f"run is NOT finished; rerun the same command to resume (exit "
              f"{128 + sig.value}).", flush=True)
        return 128 + sig.value
    kept = newest_checkpoint(model_dir)
    failures = {
        Ending.DIVERGED: (EXIT_NONFINITE, f"training diverged (every step non-finite); {kept}. "
                          "Lower --learning_rate or add --warmup_steps."),
        Ending.NONFINITE_WEIGHTS: (
            EXIT_NONFINITE, "non-finite weights (e.g. NaN images made the BatchNorm statistics "
            f"NaN): no checkpoint was written for them and training stopped; {kept}. Check the "
            "data, lower --learning_rate."),
        Ending.LOSS_GREW: (
            EXIT_LOSS_GREW, f"training diverged: the loss grew to "
            f"{outcome.loss_grew if outcome else None}, past --max_loss_growth="
            f"{max_loss_growth:g}; no checkpoint was written for these weights and training "
            f"stopped; {kept}. Lower --learning_rate or add --warmup_steps (--max_loss_growth=0 "
            "turns the check off)."),
        Ending.NONFINITE_STEP: (
            EXIT_NONFINITE, f"--on_nonfinite=stop ended training at a non-finite step; {kept}. "
            "Lower --learning_rate, add --warmup_steps, or pass --on_nonfinite=skip."),
        Ending.NOTHING_LEARNED: (
            EXIT_NOTHING_LEARNED, f"training to step {outcome.step if outcome else None} "
            f"{UNCHANGED_WEIGHTS}; nothing was exported; {kept}. Fix the cause, then rerun "
            "(--allow_flag_changes for a changed flag)."),
    }
    if ending in failures:
        code, message = failures[ending]
        print(f"error: {message}", file=sys.stderr)
        return code
    if result.export_failed:
        print(f"error: training finished (the encoder is in {model_dir}/encoder.weights.h5) "
              f"but the SavedModel export failed (the log says why); export it with python -m "
              f"aetv2_tf.export --model_dir={model_dir}.", file=sys.stderr)
        return EXIT_EXPORT
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=parse_command_line)  # flagfiles checked before absl reads them
