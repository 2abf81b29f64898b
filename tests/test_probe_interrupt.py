"""SIGTERM and SIGINT outside pretraining's steps: a probe's head stops after its epoch with a
checkpoint and resumes there, ending where an uninterrupted probe ends; a KNN probe and an
export stop at once, keeping nothing of them; each says where it stopped and how to go on, and
exits 128 + N. In-process (the signal sent to this process from inside the stage), except one
real SIGTERM to a child process.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import time

import pytest

from aetv2_tf.probes.results import RESULTS_FILENAME
from aetv2_tf.program import probe_epochs, probe_stage, signal_stop
from aetv2_tf.program.keras_checkpoints import list_checkpoints
from tests.cli import finish, start_module

HEAD = ("--stage=probe", "--pretrained=none", "--probe=linear", "--train_examples=250",
        "--val_examples=50", "--test_examples=100", "--batch_size=50", "--learning_rate=0.05")


@pytest.fixture
def fenced():
    """A SIGTERM and SIGINT handler that records what no stage caught (instead of ending the
    test session), put back after the test."""
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    yield caught
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def signalled_at(monkeypatch, owner, name: str, sig: int = signal.SIGTERM,
                 when=lambda *args, **kwargs: True):
    """``owner.name`` sends ``sig`` to this process (when ``when(*its arguments)``) before it
    runs."""
    original = getattr(owner, name)

    def sending(*args, **kwargs):
        if when(*args, **kwargs):
            os.kill(os.getpid(), sig)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, sending)


def results(model_dir: pathlib.Path) -> dict:
    found = json.loads((model_dir / RESULTS_FILENAME).read_text())
    return {key: found[key] for key in ("selected_epoch", "val_top1", "test_top1", "epochs_run",
                                        "val_top1_history")}


def test_a_head_stopped_after_its_epoch_resumes_there_and_ends_as_uninterrupted(
        tmp_path, cifar10_dir, program, monkeypatch, capsys, fenced):
    common = (*HEAD, f"--data_dir={cifar10_dir}", "--epochs=3")
    assert program(*common, f"--model_dir={tmp_path / 'whole'}") == 0
    whole = results(tmp_path / "whole")
    assert whole["epochs_run"] == 3

    model_dir = tmp_path / "stopped"
    with monkeypatch.context() as patch:  # SIGTERM during epoch 2's validation
        signalled_at(patch, probe_epochs.EpochCheckpoints, "on_epoch_end",
                     when=lambda self, epoch, logs=None: epoch == 1)
        code = program(*common, f"--model_dir={model_dir}")
    out = capsys.readouterr().out
    assert code == 143, out
    assert ("Stopped by SIGTERM after epoch 2 of 3, its checkpoint written: the probe is NOT "
            "finished; rerun the same command to go on from there (exit 143).") in out
    assert [step for step, _ in list_checkpoints(str(model_dir / "checkpoints"))] == [2]
    assert not (model_dir / RESULTS_FILENAME).exists()
    assert not fenced and signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL

    # Another course than the checkpoint's is refused, naming the flag; nothing is changed.
    assert program(*common, f"--model_dir={model_dir}", "--learning_rate=0.1") == 2
    assert "trained to epoch 2 with other values" in capsys.readouterr().err
    assert program(*common, f"--model_dir={model_dir}") == 0
    out = capsys.readouterr().out
    assert f"Resumed from checkpoint {model_dir / 'checkpoints' / 'ckpt-2.weights.h5'}" in out
    assert results(model_dir) == whole
    rows = (model_dir / "epochs.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in rows[1:]] == ["1", "2", "3"]
    assert rows == (tmp_path / "whole" / "epochs.csv").read_text().splitlines()


def test_a_knn_probe_stopped_keeps_nothing_and_says_so(tmp_path, cifar10_dir, program,
                                                        monkeypatch, capsys, fenced):
    signalled_at(monkeypatch, probe_stage, "knn_accuracy", signal.SIGINT)
    model_dir = tmp_path / "knn"
    code = program("--stage=probe", "--pretrained=none", "--probe=knn", "--train_examples=100",
                   "--test_examples=50", f"--data_dir={cifar10_dir}", f"--model_dir={model_dir}")
    out = capsys.readouterr().out
    assert code == 130, out
    assert ("Stopped by SIGINT during the knn probe: nothing of it was kept; rerun the same "
            "command to start it again (exit 130).") in out
    assert not (model_dir / RESULTS_FILENAME).exists() and not fenced


def test_an_export_stopped_keeps_nothing_and_the_run_says_how_to_redo_it(tmp_path, fenced):
    """`pretext_stage.export` under a signal: `Interrupted` (not a failed export), naming the
    encoder that is kept, the handlers in place before put back."""
    from aetv2_tf.program import pretext_stage

    class Backend:
        class config:  # noqa: N801 - the one attribute read
            class outputs:  # noqa: N801
                model_dir = str(tmp_path)

        def export(self, encoder, model):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the signal ends the wait
            raise AssertionError("the export went on after the signal")

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(signal_stop.Interrupted) as stop:
        pretext_stage.export(Backend(), None, None)
    assert str(stop.value) == (
        f"Stopped by SIGTERM during the export: nothing of it was kept; the training is finished "
        f"(its encoder: {tmp_path / 'encoder.weights.h5'}); rerun the same command to export it "
        "(exit 143).")
    assert signal.getsignal(signal.SIGTERM) is before and not fenced


@pytest.mark.slow
def test_a_real_sigterm_stops_a_head_after_an_epoch(tmp_path, cifar10_dir):
    model_dir = tmp_path / "probe"
    proc = start_module("aetv2_tf.train", *HEAD, "--epochs=200", f"--model_dir={model_dir}",
                        f"--data_dir={cifar10_dir}", "--verbose=0", "--mixed_precision=none",
                        log=tmp_path / "log")
    deadline = time.monotonic() + 240
    while not list_checkpoints(str(model_dir / "checkpoints")) and proc.poll() is None:
        assert time.monotonic() < deadline, "no epoch finished in 240 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out = finish(proc)
    assert out.returncode == 143, out.stderr[-3000:]
    kept = list_checkpoints(str(model_dir / "checkpoints"))
    assert len(kept) == 1
    assert (f"Stopped by SIGTERM after epoch {kept[0][0]} of 200, its checkpoint written"
            in out.stdout), out.stdout[-2000:]
    assert not (model_dir / RESULTS_FILENAME).exists()
