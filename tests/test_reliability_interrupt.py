"""Interruptions of `python -m aetv2_tf.train`, and `--deterministic`, on real CIFAR-10 slices.

- SIGTERM (a subprocess) / SIGINT (in-process, the same handler): training stops after the
  current step, a final checkpoint at that step is written, nothing is exported, and the
  process exits 128 + the signal.
- SIGKILL (while a checkpoint is being written, or at a random moment): rerunning the same
  command resumes from the newest complete checkpoint and ends bitwise where an uninterrupted
  `--deterministic` run ends: weights, BatchNorm statistics, optimizer slots and step counters
  (every variable of the final `ckpt-<step>.weights.h5`), and the same learning rate at every
  step; so does a run stopped by `--stop_after_steps`. A run whose checkpoints are
  `tf.train.Checkpoint` files (aetv2_tf 0.1) is refused, naming the version that resumes it.
- Two `--deterministic` runs give bitwise-identical checkpoints and losses.

How a damaged checkpoint is read, in-process: test_damaged_checkpoints_are_set_aside.py.
"""

from __future__ import annotations

import os
import pathlib
import random
import re
import signal
import time

import keras
import numpy as np
import pytest

from aetv2_tf.program.checkpoint_saver import CheckpointSaver
from aetv2_tf.program.keras_checkpoints import KerasCheckpoints
from aetv2_tf.program.run_control import Outcome, RunControl
from aetv2_tf.program.signal_stop import SignalStop
from tests.cli import finish, listed_step, read_scalars, start_module, train, train_args
from tests.folders import damage_file

STEPS = 8
ITERATIONS = "optimizer/inner_optimizer/vars/0"  # the step (Keras's first optimizer variable)
COMMON = (f"--train_steps={STEPS}", "--checkpoint_every_steps=2", "--summary_every_steps=1",
          "--image_summary_every_steps=1000", "--export=false", "--deterministic")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cifar10_dir) -> tuple[pathlib.Path, pathlib.Path, float]:
    """Two uninterrupted `--deterministic` runs of 8 steps, run side by side:
    (model_dir, twin model_dir, wall seconds of one run)."""
    tmp = tmp_path_factory.mktemp("reference")
    start = time.monotonic()
    procs = [start_module("aetv2_tf.train", *train_args(tmp / name, cifar10_dir, *COMMON),
                          log=tmp / f"{name}_log") for name in ("run", "twin")]
    for proc in procs:
        out = finish(proc)
        assert out.returncode == 0, out.stderr[-3000:]
    return tmp / "run", tmp / "twin", time.monotonic() - start


def final_checkpoint(model_dir: pathlib.Path) -> dict[str, np.ndarray]:
    """Every variable of the newest checkpoint (`ckpt-<step>.weights.h5`), by its path there."""
    import h5py

    from aetv2_tf.program.keras_checkpoints import list_checkpoints

    out: dict[str, np.ndarray] = {}
    with h5py.File(list_checkpoints(str(model_dir / "checkpoints"))[-1][1], "r") as f:
        f.visititems(lambda name, item: out.__setitem__(name, item[()])
                     if isinstance(item, h5py.Dataset) else None)
    return out


def assert_same_final_state(run: pathlib.Path, reference: pathlib.Path) -> None:
    """The same final checkpoint, bitwise, the same learning rate at every step, and losses
    that track the uninterrupted run's at every step (the same data stream and state)."""
    got, want = final_checkpoint(run), final_checkpoint(reference)
    assert sorted(got) == sorted(want)
    assert got[ITERATIONS] == STEPS
    slots = [key for key in got if key.startswith("optimizer/inner_optimizer/vars/")]
    assert len(slots) > 10, "no Adam slots in the checkpoint"
    differing = [key for key in want if not np.array_equal(got[key], want[key])]
    assert not differing, f"{len(differing)} of {len(want)} variables differ: {differing[:5]}"
    scalars, scalars_want = (read_scalars(d / "train") for d in (run, reference))
    lr, lr_want = scalars["learning_rate"], scalars_want["learning_rate"]
    assert sorted(lr) == list(range(1, STEPS + 1))
    assert lr == lr_want
    assert sorted(scalars["loss"]) == list(range(1, STEPS + 1))
    for step, loss in scalars_want["loss"].items():
        assert scalars["loss"][step] == pytest.approx(loss, rel=2e-2, abs=1e-3), step


def kill_when(proc, ready, timeout: float = 300) -> bool:
    """SIGKILLs `proc` as soon as `ready()` is true (polled every millisecond); False if the
    run ended first."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if ready():
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.001)
    proc.kill()
    proc.wait()
    return False


def resume(model_dir: pathlib.Path, cifar10_dir) -> int:
    """Reruns the same command; returns the step it resumed from (0: started afresh), which its
    summary line gives as its start; for a run that had finished, which the rerun says, its
    steps."""
    proc = train(model_dir, cifar10_dir, *COMMON)
    if f"finished all its {STEPS} steps before; nothing was trained" in proc.stdout:
        return STEPS
    assert f"steps={STEPS}" in proc.stdout
    found = re.search(r"Resumed from checkpoint (\S+) at step (\d+)\.", proc.stdout)
    step = int(found.group(2)) if found else 0
    assert f"steps={STEPS}, start_step={step}," in proc.stdout, proc.stdout[-2000:]
    return step


@pytest.mark.slow
def test_deterministic_runs_are_bitwise_identical(reference):
    first, second, _ = reference
    assert_same_final_state(second, first)
    losses = [read_scalars(d / "train")["loss"] for d in (first, second)]
    assert sorted(losses[0]) == list(range(1, STEPS + 1)) and losses[0] == losses[1]


@pytest.mark.slow
def test_sigkill_during_a_checkpoint_write_resumes_from_the_last_complete_one(
        reference, tmp_path, cifar10_dir):
    """Killed the moment the temporary file of ckpt-4 appears (or ckpt-4 itself): ckpt-4 is
    partial or at best just complete; the rerun resumes from the newest complete checkpoint and
    ends exactly as the uninterrupted run."""
    model_dir = tmp_path / "run"
    proc = start_module("aetv2_tf.train", *train_args(model_dir, cifar10_dir, *COMMON),
                        log=tmp_path / "killed")
    assert kill_when(proc, lambda: any((model_dir / "checkpoints").glob("*ckpt-4.*")))
    left = sorted(p.name for p in (model_dir / "checkpoints").iterdir())
    print(f"[info] after SIGKILL: {left}")
    complete = listed_step(model_dir)
    assert complete in (2, 4), left
    assert resume(model_dir, cifar10_dir) == complete
    assert_same_final_state(model_dir, reference[0])


@pytest.mark.slow
def test_sigkill_at_a_random_moment_resumes_exactly(reference, tmp_path, cifar10_dir):
    """Killed after a random delay (start-up, training, or a checkpoint write): the rerun
    resumes from the newest complete checkpoint, if any, and ends exactly as the reference."""
    seed = int(os.environ.get("AETV2_KILL_SEED", time.time_ns() % 2**32))
    # Up to about the length of one run (the reference's wall time is that of two side by side).
    delay = random.Random(seed).uniform(0.5, 0.5 * reference[2])
    print(f"[info] SIGKILL after {delay:.2f} s (AETV2_KILL_SEED={seed} repeats it)")
    model_dir = tmp_path / "run"
    proc = start_module("aetv2_tf.train", *train_args(model_dir, cifar10_dir, *COMMON),
                        log=tmp_path / "killed")
    start = time.monotonic()
    if not kill_when(proc, lambda: time.monotonic() - start >= delay):
        print("[info] the run ended before the delay: the rerun must find nothing to do")
    complete = listed_step(model_dir)
    assert resume(model_dir, cifar10_dir) == complete, f"seed {seed}"
    assert_same_final_state(model_dir, reference[0])


@pytest.mark.slow
def test_a_run_stopped_by_stop_after_steps_says_so_and_resumes_exactly(reference, tmp_path,
                                                                       cifar10_dir):
    """A run stopped at step 4 by `--stop_after_steps` says so, and that a rerun goes on (exit
    0, never "Done"); rerunning the command without the flag resumes from step 4 and ends
    bitwise where the uninterrupted run ends, every learning rate the same."""
    model_dir = tmp_path / "run"
    first = train(model_dir, cifar10_dir, *COMMON, "--stop_after_steps=4")
    assert f"Stopped (pretext) at step 4 of {STEPS}: steps=4," in first.stdout, first.stdout
    assert "The run is not finished: --stop_after_steps=4 ended this invocation at step 4 of " \
        f"{STEPS}" in first.stdout and "Done (" not in first.stdout
    assert resume(model_dir, cifar10_dir) == 4
    assert_same_final_state(model_dir, reference[0])


def test_a_run_with_tf_checkpoints_of_version_0_1_is_refused_with_the_version_that_resumes_it(
        tmp_path, cifar10_dir, program, capsys):
    """A model_dir whose checkpoints are all `tf.train.Checkpoint` files (the format of aetv2_tf
    0.1: `checkpoint`, `ckpt-<step>.index`, `ckpt-<step>.data-*`) exits 2 before anything is
    written, naming the commit whose program resumes it; every file stays as it was."""
    from aetv2_tf.files.savedmodel import TF_CHECKPOINTS_RESUMED_BY

    model_dir = tmp_path / "run"
    checkpoints = model_dir / "checkpoints"
    checkpoints.mkdir(parents=True)
    for name, text in (("checkpoint", 'model_checkpoint_path: "ckpt-4"\n'),
                       ("ckpt-4.index", "index"), ("ckpt-4.data-00000-of-00001", "data")):
        (checkpoints / name).write_text(text)
    (model_dir / "flags.json").write_text('{"stage": "pretext", "version": "0.1.0"}\n')
    before = {p: p.read_bytes() for p in model_dir.rglob("*") if p.is_file()}
    assert program(*train_args(model_dir, cifar10_dir)) == 2
    err = capsys.readouterr().err
    assert "tf.train.Checkpoint format of aetv2_tf 0.1" in err, err
    assert f"git checkout {TF_CHECKPOINTS_RESUMED_BY}" in err and "Nothing was changed" in err
    assert {p: p.read_bytes() for p in model_dir.rglob("*") if p.is_file()} == before


def test_sigint_stops_after_the_step_with_a_final_checkpoint(tmp_path):
    """Ctrl-C goes through the handler of SIGTERM (whose exit is tested above), in-process here:
    SIGINT during step 3 of `fit` ends training after that step, `RunControl` writes ckpt-3,
    and the previous SIGINT handler is back afterwards."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    store = KerasCheckpoints(str(tmp_path), 3)

    class Interrupt(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 2:
                os.kill(os.getpid(), signal.SIGINT)

    escaped = []  # SIGINTs that reached the handler in place before fit (must stay empty)

    def before(*args):
        escaped.append(args)

    previous = signal.signal(signal.SIGINT, before)
    try:
        control = RunControl(0, 10, 10, saver=CheckpointSaver(store, every=100),
                             signals=SignalStop())
        model.fit(np.zeros((40, 2)), np.zeros((40, 1)), batch_size=4, verbose=0,
                  callbacks=[control, Interrupt()])
        restored = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert control.outcome().signal == "SIGINT" and not escaped
    assert control.step == 3 == int(model.optimizer.iterations.numpy())
    assert store.latest_step() == 3 and restored is before


def test_workers_stop_on_the_agreed_sums_only():
    """Several workers (`SignalStop(agree)`): a signal that arrives while `agree` waits for
    the other workers, after this worker's count was sent, stops nobody at this step (the
    others were told 0: a worker that stopped alone would leave them in the next step's
    collectives); it is sent after the next step, and all stop then. A signal another worker
    received stops this one too."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.stop_training, sent = False, []

    def agree_while_signalled(sigint, sigterm):  # the signal lands during the collective
        sent.append((sigint, sigterm))
        if len(sent) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return sigint, sigterm

    def started(agree) -> RunControl:
        control = RunControl(0, 10, 10, signals=SignalStop(agree))
        control.set_model(model)
        control.on_train_begin()
        control.on_epoch_begin(0)
        return control

    previous = signal.getsignal(signal.SIGTERM)
    control = started(agree_while_signalled)
    try:
        control.on_train_batch_end(0)
        assert control.signals.received == "SIGTERM" and not model.stop_training
        control.on_train_batch_end(1)
        assert sent == [(0, 0), (0, 1)] and model.stop_training
    finally:
        control.on_train_end()
    assert signal.getsignal(signal.SIGTERM) is previous
    assert control.outcome() == Outcome(2, 10, signal="SIGTERM")

    model.stop_training = False
    other = started(lambda sigint, sigterm: (sigint, sigterm + 1))
    try:
        other.on_train_batch_end(0)
    finally:
        other.on_train_end()
    assert other.signals.received == "SIGTERM" and model.stop_training


@pytest.mark.slow
def test_one_process_per_model_dir_and_the_lock_dies_with_its_holder(tmp_path, cifar10_dir,
                                                                    program, capsys):
    """A second process on a model_dir in use exits 2 within seconds, naming the holder's pid and
    host, and changes nothing; once the holder is killed (SIGKILL: no cleanup of its own), the
    OS has released the lock and the same command resumes. (The holder is a command line; the
    second and third are this process, `program`.)"""
    model_dir = tmp_path / "run"
    args = train_args(model_dir, cifar10_dir, "--train_steps=100000",
                      "--checkpoint_every_steps=100000")
    first = start_module("aetv2_tf.train", *args, log=tmp_path / "first")
    try:
        lock = model_dir / ".lock"
        deadline = time.monotonic() + 120
        while not (lock.exists() and f"pid {first.pid} " in lock.read_text()):
            assert first.poll() is None and time.monotonic() < deadline, "the run never started"
            time.sleep(0.5)
        flags_before = (model_dir / "flags.json").read_bytes()
        # even --overwrite with other essential flags (which would delete the run) is refused
        code = program(*train_args(model_dir, cifar10_dir, "--train_steps=100000",
                                   "--checkpoint_every_steps=100000", "--batch_size=32",
                                   "--overwrite"))
        err = capsys.readouterr().err
        assert code == 2, err[-2000:]
        assert f"is in use by pid {first.pid} on host" in err
        assert first.poll() is None and (model_dir / "flags.json").read_bytes() == flags_before
    finally:
        first.kill()
        first.wait()
    assert program(*train_args(model_dir, cifar10_dir, "--train_steps=100000",
                               "--checkpoint_every_steps=100000", "--stop_after_steps=1")) == 0
    assert "Stopped (pretext) at step 1 of 100000: steps=1," in capsys.readouterr().out


DISK_FULL_AT_FSYNC = """
import errno, os, runpy, sys
real = os.fsync
def fsync(fd):  # the disk fills while ckpt-6 is written (Linux: the fd's path in /proc)
    if "-ckpt-6.weights.h5" in os.readlink(f"/proc/self/fd/{fd}"):
        raise OSError(errno.ENOSPC, "No space left on device")
    return real(fd)
os.fsync = fsync
runpy.run_module("aetv2_tf.train", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
def test_a_full_disk_then_a_damaged_checkpoint_and_the_run_resumes_exactly(
        tmp_path, cifar10_dir, reference):
    """Two faults of one run, each met as the program meets it. The disk fills while ckpt-6 is
    written: exit 5 with the fix, ckpt-2 and ckpt-4 intact (their checksums match), no
    temporary left. Then 4 KiB of ckpt-4 are overwritten (the same size: only the checksum sees
    it): the rerun renames it `*.bad` (nothing deleted), says so, resumes from ckpt-2 and ends
    bitwise like the uninterrupted run. The other kinds of damage, and every checkpoint
    damaged, are `restore_checkpoint`'s (the one reader of both backends' programs): the
    parametrized test of test_damaged_checkpoints_are_set_aside.py."""
    import subprocess
    import sys

    from aetv2_tf.files.saving import damage
    from tests.cli import REPO, _env

    model_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", DISK_FULL_AT_FSYNC,
                           *train_args(model_dir, cifar10_dir, *COMMON)], cwd=REPO, env=_env({}),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 5, proc.stderr[-3000:]
    newest = model_dir / "checkpoints" / "ckpt-4.weights.h5"
    assert "is full" in proc.stderr and f"{newest}, is intact" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in (model_dir / "checkpoints").iterdir()) == [
        "ckpt-2.weights.h5", "ckpt-2.weights.h5.sha256", "ckpt-4.weights.h5",
        "ckpt-4.weights.h5.sha256"]
    assert damage(str(newest)) is None and damage(str(newest).replace("-4.", "-2.")) is None

    damage_file(newest, "overwritten")
    proc = train(model_dir, cifar10_dir, *COMMON)
    assert f"Set aside {newest} as {newest}.bad: " in proc.stdout
    assert "Resumed from checkpoint" in proc.stdout and "at step 2." in proc.stdout
    assert f"steps={STEPS}" in proc.stdout
    assert (model_dir / "checkpoints" / "ckpt-4.weights.h5.bad").is_file()
    assert_same_final_state(model_dir, reference[0])


SECOND_SIGNAL_IN_FINAL_SAVE = """
import os, runpy, signal
from aetv2_tf.program import keras_checkpoints
real = keras_checkpoints.KerasCheckpoints.save
def save(self, model, step):
    handler = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    if getattr(handler, "received", None):  # stopping: this is the final checkpoint
        os.kill(os.getpid(), getattr(signal, handler.received))  # the same signal again
    return real(self, model, step)
keras_checkpoints.KerasCheckpoints.save = save
runpy.run_module("aetv2_tf.train", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_with_a_final_checkpoint_even_when_sent_again_during_it(sig, tmp_path,
                                                                              cifar10_dir):
    """Ctrl-C or SIGTERM (preemption) on the command line: training stops after the current
    step, a final checkpoint at that step, nothing exported, exit 128 + N and a last line that
    says the run is not finished and how to resume (a finished run exits 0: every other CLI
    test); the same signal again while that checkpoint is written (injected) waits for it to
    be complete."""
    import subprocess
    import sys

    from tests.cli import REPO, _env

    model_dir = tmp_path / "run"
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", SECOND_SIGNAL_IN_FINAL_SAVE,
                                 *train_args(model_dir, cifar10_dir, "--train_steps=500",
                                             "--checkpoint_every_steps=3")],
                                cwd=REPO, env=_env({}), stdout=out, stderr=err, text=True)
    started = model_dir / "checkpoints" / "ckpt-3.weights.h5"
    deadline = time.monotonic() + 300
    while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # into a later step: a checkpoint is still to be written after the signal
    proc.send_signal(sig)
    proc.wait(timeout=120)
    stdout, stderr = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
    out = stdout + stderr
    code = 128 + sig.value
    assert proc.returncode == code, out[-3000:]
    assert "while a checkpoint is written: stopping once it is complete" in out
    assert stdout.rstrip().splitlines()[-1].startswith(f"Stopped by {sig.name} at step "), \
        stdout[-2000:]
    assert f"rerun the same command to resume (exit {code})" in stdout
    done = re.search(r"Stopped \(pretext\) at step \d+ of \d+: steps=(\d+),.*interrupted_by=(\w+)",
                     stdout)
    assert done and done.group(2) == sig.name and "Done (" not in out, out[-2000:]
    reached = int(done.group(1))
    assert 3 < reached < 500
    assert listed_step(model_dir) == reached  # the final checkpoint is at the step reached
    assert final_checkpoint(model_dir)[ITERATIONS] == reached
    assert not (model_dir / "export").exists()  # an interrupted run is not exported
