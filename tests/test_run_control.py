"""How a pretraining's fit is stopped and saved, and what the program makes of its end, in
process: `run_control.RunControl` (skipped steps, loss growth and checkpoints in their order),
its typed `Outcome`, the exit codes of `aetv2_tf.train`, a write that finds no room, and the
library's setting warnings named in flags. (Signals: test_reliability_interrupt.py; the same
parts in real runs: test_reliability_numeric.py and the CLI tests.)"""

from __future__ import annotations

import errno
import logging

import keras
import numpy as np
import pytest

from aetv2_tf.method import optimizers
from aetv2_tf.program.checkpoint_saver import CheckpointSaver
from aetv2_tf.program.divergence import LossGrowth, NonFiniteSteps
from aetv2_tf.program.run_control import Ending, Outcome, RunControl, StageResult


class FakeModel:
    """What `RunControl` touches of a model when no step runs: its optimizer and the stop."""

    def __init__(self, optimizer=None):
        self.optimizer, self.stop_training, self.weights = optimizer, False, []


class ListStore:
    """A `checkpoint_saver.CheckpointStore` that keeps the steps saved and set aside."""

    def __init__(self):
        self.saved, self.aside = [], []

    def latest_step(self):
        return self.saved[-1] if self.saved else None

    def save(self, model, step):
        self.saved.append(step)
        return f"ckpt-{step}"

    def set_aside(self, step, reason):
        self.saved.remove(step)
        self.aside.append((step, reason))


def skipping_optimizer(skipped: int = 0):
    opt = optimizers.build_optimizer("sgd", 0.1)
    opt.build([keras.Variable(np.ones(2, np.float32))])
    opt.skipped_steps.assign(skipped)  # as restored from a checkpoint
    return opt


def test_skip_mode_stops_a_run_whose_every_step_is_non_finite():
    """Skipping is for the odd bad batch: 10 skipped steps in a row end the run as diverged
    (exit 3)."""
    opt = skipping_optimizer()
    model = FakeModel(opt)
    control = RunControl(0, 30, 30, nonfinite=NonFiniteSteps(stop=False, patience=10))
    control.set_model(model)
    control.on_train_begin()
    control.on_epoch_begin(0)
    stopped_at = None
    for batch in range(30):
        if batch != 3:  # a good step at batch 3 (the counter does not move) resets the count
            opt.skipped_steps.assign_add(1)
        control.on_train_batch_end(batch)
        if model.stop_training:
            stopped_at = batch
            break
    assert stopped_at == 13  # skips at batches 4..13: ten in a row
    assert control.outcome() == Outcome(14, 30, diverged=True)
    assert control.outcome().ending is Ending.DIVERGED


def test_a_resumed_run_counts_only_its_own_skipped_steps():
    """`skipped_steps` is restored with the optimizer: the skips of an earlier invocation must
    not stop (--on_nonfinite=stop) or divert a resumed run at its first check."""
    opt = skipping_optimizer(3)
    model = FakeModel(opt)
    control = RunControl(40, 100, 100, nonfinite=NonFiniteSteps(stop=True))
    control.set_model(model)
    control.on_train_begin()
    control.on_epoch_begin(0)
    control.on_train_batch_end(0)
    assert not model.stop_training and control.outcome().ending is Ending.STOP_AFTER_STEPS
    opt.skipped_steps.assign_add(1)
    control.on_train_batch_end(1)
    assert model.stop_training and control.outcome() == Outcome(42, 100, nonfinite_step=True)
    assert control.outcome().ending is Ending.NONFINITE_STEP


def test_loss_growth_keeps_the_last_checkpoint_whose_weights_gave_a_good_loss():
    """The loss growth is checked before the save, a checkpoint every step, the per-step
    losses 3, 2, 29, 31 (Keras logs their running mean): at step 4 the loss is over 10 times
    the first: no checkpoint from then on (nor at the end), and the one of step 3, whose
    weights gave step 4's loss, is set aside: the newest is step 2's."""
    saver = CheckpointSaver(ListStore(), every=1)
    assert saver.newest() == "no checkpoint was written yet"  # never "step None"
    control = RunControl(0, 10, 10, saver=saver, growth=LossGrowth(10))
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.stop_training = False
    control.set_model(model)
    control.on_train_begin()
    control.on_epoch_begin(0)
    losses = [3.0, 2.0, 29.0, 31.0, 2.0]
    for batch in range(len(losses)):
        control.on_train_batch_end(batch, {"loss": np.mean(losses[:batch + 1])})
        if model.stop_training:
            break
    control.on_train_end()
    assert control.step == 4 and model.stop_training and saver.store.saved == [1, 2]
    assert saver.store.aside == [(3, "its weights gave the loss 31, over 10 times the first 3")]
    grew = "31 at step 4, 10.3 times its first logged value 3"
    assert control.outcome() == Outcome(4, 10, loss_grew=grew)
    assert control.outcome().ending is Ending.LOSS_GREW
    assert saver.newest() == "the newest checkpoint stays the one of step 2"


def test_the_last_step_and_the_deadline_stop_with_a_final_checkpoint():
    """The step is capped at this invocation's stop and saved when training ends (once, not
    again where an interval saved it); a deadline stops after the step during which it
    passed."""
    saver = CheckpointSaver(ListStore(), every=4)
    clock = iter([0.0, 0.0, 5.0])
    control = RunControl(2, 6, 10, saver=saver, deadline=4.0, clock=lambda: next(clock))
    model = FakeModel()
    control.set_model(model)
    control.on_train_begin()
    control.on_epoch_begin(0)
    for batch in range(3):
        control.on_train_batch_end(batch)
    control.on_train_end()
    assert model.stop_training and control.step == 5 and saver.store.saved == [4, 5]
    assert control.outcome() == Outcome(5, 10, deadline=True)
    assert control.outcome().ending is Ending.STOP_AFTER_SECONDS

    saver = CheckpointSaver(ListStore(), every=2)
    control = RunControl(0, 4, 4, saver=saver)
    control.set_model(FakeModel())
    control.on_train_begin()
    control.on_epoch_begin(0)
    for batch in range(4):
        control.on_train_batch_end(batch)
    control.on_train_end()
    assert saver.store.saved == [2, 4] and control.outcome().finished


def test_steps_that_change_no_trainable_weight_stop_without_a_checkpoint():
    """``watch_weights``: at the first checkpoint due after steps that left the trainable
    weights bitwise as they started, training stops, nothing is saved (nor at the end) and it
    ends as NOTHING_LEARNED; weights that changed are saved and not read again."""
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    for change in (False, True):
        saver = CheckpointSaver(ListStore(), every=2)
        control = RunControl(0, 4, 4, saver=saver, watch_weights=True)
        model.stop_training = False
        control.set_model(model)
        control.on_train_begin()
        control.on_epoch_begin(0)
        for batch in range(4):
            if change:
                model.layers[0].bias.assign_add([1.0])
            control.on_train_batch_end(batch)
            if model.stop_training:
                break
        control.on_train_end()
        outcome = control.outcome()
        if change:
            assert saver.store.saved == [2, 4] and outcome.finished
        else:
            assert control.step == 2 and saver.store.saved == [] and outcome.unchanged
            assert outcome.ending is Ending.NOTHING_LEARNED
            assert outcome.entries() == {"unchanged_weights": True}


def test_an_outcome_ends_by_the_first_cause_and_shows_every_one():
    both = Outcome(5, 10, signal="SIGTERM", nonfinite_weights=True)
    assert both.ending is Ending.SIGNAL and not both.finished
    assert both.entries() == {"interrupted_by": "SIGTERM", "nonfinite_weights": True}
    assert Outcome(10, 10, nonfinite_weights=True).ending is Ending.NONFINITE_WEIGHTS
    assert Outcome(10, 10).finished and Outcome(10, 10).entries() == {}
    assert Outcome(3, 10).ending is Ending.STOP_AFTER_STEPS


@pytest.mark.parametrize("outcome, code", [({}, 0), ({"signal": "SIGTERM"}, 143),
                                           ({"signal": "SIGINT"}, 130),
                                           ({"diverged": True}, 3),
                                           ({"nonfinite_step": True}, 3),
                                           ({"nonfinite_weights": True}, 3),
                                           ({"loss_grew": "7.2e+13 at step 8"}, 7),
                                           ({"unchanged": True}, 8)])
def test_exit_codes(outcome, code, capsys):
    from aetv2_tf.train import exit_code

    assert exit_code(StageResult({}, Outcome(7, 10, **outcome))) == code
    if code in (3, 7, 8):  # what is kept, named: never "step None"
        err = capsys.readouterr().err
        assert "no checkpoint was written" in err and "None" not in err, err


def test_a_failed_export_and_a_probe_exit_4_and_0(capsys):
    from aetv2_tf.train import exit_code

    assert exit_code(StageResult({}, Outcome(8, 8), export_failed=True), "run") == 4
    assert "python -m aetv2_tf.export --model_dir=run" in capsys.readouterr().err
    assert exit_code(StageResult({"test_top1": 50.0})) == 0


@pytest.mark.parametrize("code, exit_status", [(errno.ENOSPC, 5), (errno.EDQUOT, 5),
                                               (errno.EFBIG, 5), (errno.EACCES, None)])
def test_a_write_without_room_exits_5_by_its_errno(code, exit_status, program, capsys,
                                                   monkeypatch, tmp_path, cifar10_dir):
    """A full disk, a full quota or the file-size limit (``ulimit -f``: EFBIG) met anywhere in
    the run exits 5 with the fix, told apart by the error's errno, never by its text; another
    OSError is no full disk and propagates."""
    from aetv2_tf.program import stages

    def full(config, backend_type):
        raise OSError(code, f"{errno.errorcode[code]} (errno = 28 in the text is not read)")

    monkeypatch.setattr(stages, "run", full)
    args = (f"--model_dir={tmp_path / 'run'}", f"--data_dir={cifar10_dir}", "--train_steps=2")
    if exit_status is None:
        with pytest.raises(OSError):
            program(*args)
        return
    assert program(*args) == exit_status
    err = capsys.readouterr().err
    assert "no checkpoint was complete yet" in err and "rerun the same command" in err
    assert ("file-size limit" in err) == (code == errno.EFBIG), err


def test_the_librarys_setting_warnings_are_logged_with_their_flags(caplog):
    """The library says what to change in its own terms and names the settings; the program
    adds the flags that set them (`SETTING_FLAGS`, flags of the command line), without
    rewriting the text."""
    from aetv2_tf import AETV2
    from aetv2_tf.program.flags import program_flags
    from aetv2_tf.program.pretext_stage import SETTING_FLAGS, settings_as_flags

    assert set(SETTING_FLAGS.values()) <= {flag.name for flag in program_flags()}
    with caplog.at_level(logging.WARNING), settings_as_flags():
        AETV2.build_optimizer(steps=8)
    text = caplog.text
    assert "warmup_steps=1000 in a run of 8 steps: the learning rate peaks at " in text
    assert "or train for at least 2000 steps (flags: --warmup_steps, --train_steps)" in text
    caplog.clear()
    with caplog.at_level(logging.WARNING), settings_as_flags(show=False):
        AETV2.build_optimizer(steps=8)
    assert caplog.text == ""


def test_the_aetv1_warning_names_its_settings():
    """The MSE decoder warning names ``decoder_scale`` and ``learning_rate``, both of which the
    program maps to flags."""
    import aetv2_tf
    from aetv2_tf import AETV1
    from aetv2_tf.errors import SettingWarning
    from aetv2_tf.program.pretext_stage import SETTING_FLAGS

    model = aetv2_tf.build_pairs_model(aetv2_tf.build_backbone("nin"), seed=0)
    with pytest.warns(SettingWarning) as record:
        AETV1.compile(model, steps=10)
    named = [w.message.settings for w in record if isinstance(w.message, SettingWarning)]
    assert named and all(set(s) <= set(SETTING_FLAGS) for s in named), named
    assert ("decoder_scale", "learning_rate") in named
