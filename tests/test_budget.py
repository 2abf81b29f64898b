"""`--train_seconds`: a run sized by the step rate measured on this machine (the quickstart's
way of taking minutes on every CPU), recorded so that a resumed run keeps its size."""

from __future__ import annotations

import json
import re

import pytest

from aetv2_tf.program import run_length
from aetv2_tf.program.config import check_machine
from aetv2_tf.program.rundir import UsageError
from tests.cli import train, train_args


class FakeClock:
    """`time.perf_counter` advancing `tick` seconds per call: no wall-clock dependence."""

    def __init__(self, tick: float):
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


BUDGETED = ("--train_seconds=30", "--batch_size=64", "--steps_per_execution=2")


def test_budget_steps_from_the_measured_rate_then_from_the_record(configured, monkeypatch,
                                                                  capsys, tmp_path):
    config = configured(f"--model_dir={tmp_path}", *BUDGETED, "--quick_knn_train=0")
    monkeypatch.setattr(run_length.time, "perf_counter", FakeClock(0.5))  # 2 steps/s an execution
    calls = []

    def fit_first_steps(n, timer):
        calls.append(n)
        for execution in range(n // 2):
            timer.on_train_batch_end(2 * execution + 1)

    # 5 executions of 2 steps, one mark each 0.5 s: the last 3 intervals, 6 steps in 1.5 s.
    assert run_length.budget_steps(config, fit_first_steps) == 120 and calls == [10]
    record = json.loads((tmp_path / "budget.json").read_text())
    assert record["train_steps"] == 120 and record["pairs_per_sec"] == 4 * 64
    out = capsys.readouterr().out
    assert "--train_steps=120 of 64 pairs, about 30 s of training" in out
    assert "Note:" not in out  # no quick KNN, nothing to promise
    assert run_length.budget_steps(config, fit_first_steps) == 120 and calls == [10]  # read


def test_a_budget_too_small_for_the_quick_knn_says_what_would_suffice(configured, monkeypatch,
                                                                      capsys, tmp_path):
    """A slow CPU's 150 s buy too few pairs for the quick KNN to show learning: the run says so
    and gives the --train_seconds that trains `LEARNING_VISIBLE_PAIRS` at the measured rate."""
    config = configured(f"--model_dir={tmp_path}", *BUDGETED, "--quick_knn_train=5000")

    def fit_first_steps(n, timer):
        for execution in range(n // 2):
            timer.on_train_batch_end(2 * execution + 1)

    monkeypatch.setattr(run_length.time, "perf_counter", FakeClock(0.5))  # 256 pairs/s
    assert run_length.budget_steps(config, fit_first_steps) == 120
    # 25,600 pairs at 256 pairs/s: 100 s.
    out = capsys.readouterr().out
    assert "Note: 7,680 pairs are few" in out and "--train_seconds=100 trains 25,600" in out
    (tmp_path / "more").mkdir()
    config = configured(f"--model_dir={tmp_path / 'more'}", *BUDGETED[1:], "--train_seconds=100",
                        "--quick_knn_train=5000")
    assert run_length.budget_steps(config, fit_first_steps) == 400
    assert "Note:" not in capsys.readouterr().out


@pytest.mark.slow
def test_a_budgeted_cli_run_records_its_size_and_resumes_with_it(tmp_path, cifar10_dir,
                                                                  program, capsys):
    """The command line sizes the run and records it; the same command again (in-process,
    `program`) reads the record and finds the run complete."""
    run = train(tmp_path / "run", cifar10_dir, "--train_seconds=1", "--export=false",
                "--checkpoint_every_steps=1000")
    line = re.search(r"--train_steps=(\d+) of 16 pairs", run.stdout)
    assert line, run.stdout[-2000:]
    recorded = json.loads((tmp_path / "run" / "budget.json").read_text())
    assert recorded["train_steps"] == int(line.group(1)) >= 1
    assert f"Done (pretext): steps={recorded['train_steps']}," in run.stdout
    assert program(*train_args(tmp_path / "run", cifar10_dir, "--train_seconds=1",
                               "--export=false")) == 0
    again = capsys.readouterr().out
    assert "Time budget" not in again  # the recorded size, no new measurement
    # the run of the recorded size is complete: said so, nothing trained
    assert f"Complete: the run in {tmp_path / 'run'} finished all its " \
        f"{recorded['train_steps']} steps before" in again, again


def test_another_budget_for_a_recorded_run_is_refused(configured, tmp_path):
    """Refused by the checks the adapters run before anything is written (reading the flags
    opens no file of the run)."""
    (tmp_path / "budget.json").write_text(json.dumps({"train_seconds": 150.0,
                                                      "train_steps": 503}))
    other = configured(f"--model_dir={tmp_path}", "--train_seconds=60")
    with pytest.raises(UsageError, match="--train_seconds=60 differs from the 150.0"):
        check_machine(other, 1, "tensorflow", accelerator=False)
    config = configured(f"--model_dir={tmp_path}", "--train_seconds=150")
    check_machine(config, 1, "tensorflow", accelerator=False)
    assert run_length.recorded_budget(config)["train_steps"] == 503
