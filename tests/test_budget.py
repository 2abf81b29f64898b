"""`--train_seconds`: a run sized by the step rate measured on this machine (the quickstart's
way of taking minutes on every CPU), recorded so that a resumed run keeps its size."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
from absl import flags

from aetv2_tf.program import common as program
from aetv2_tf.program.rundir import UsageError
from tests.cli import train


class FakeClock:
    """`time.perf_counter` advancing `tick` seconds per call: no wall-clock dependence."""

    def __init__(self, tick: float):
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


@pytest.fixture
def parsed_flags(tmp_path):
    """The program's FLAGS, parsed, with --model_dir=tmp_path; values restored afterwards."""
    if not flags.FLAGS.is_parsed():
        flags.FLAGS(["test", f"--model_dir={tmp_path}"])
    names = ("model_dir", "train_seconds", "batch_size", "steps_per_execution", "stage",
             "quick_knn_train")
    saved = {name: flags.FLAGS[name].value for name in names}
    flags.FLAGS["model_dir"].value = str(tmp_path)
    yield flags.FLAGS
    for name, value in saved.items():
        flags.FLAGS[name].value = value


def test_budget_steps_from_the_measured_rate_then_from_the_record(parsed_flags, monkeypatch,
                                                                  capsys, tmp_path):
    F = parsed_flags
    for name, value in (("train_seconds", 30.0), ("batch_size", 64), ("steps_per_execution", 2),
                        ("quick_knn_train", 0)):
        F[name].value = value
    monkeypatch.setattr(program.time, "perf_counter", FakeClock(0.5))  # 2 steps/s per execution
    calls = []

    def fit_first_steps(n, timer):
        calls.append(n)
        for execution in range(n // 2):
            timer.on_train_batch_end(2 * execution + 1)

    # 5 executions of 2 steps, one mark each 0.5 s: the last 3 intervals, 6 steps in 1.5 s.
    assert program.budget_steps(fit_first_steps) == 120 and calls == [10]
    record = json.loads((tmp_path / "budget.json").read_text())
    assert record["train_steps"] == 120 and record["pairs_per_sec"] == 4 * 64
    out = capsys.readouterr().out
    assert "--train_steps=120 of 64 pairs, about 30 s of training" in out
    assert "Note:" not in out  # no quick KNN, nothing to promise
    assert program.budget_steps(fit_first_steps) == 120 and calls == [10]  # read, not measured


def test_a_budget_too_small_for_the_quick_knn_says_what_would_suffice(parsed_flags, monkeypatch,
                                                                      capsys, tmp_path):
    """A slow CPU's 150 s buy too few pairs for the quick KNN to show learning: the run says so
    and gives the --train_seconds that trains `LEARNING_VISIBLE_PAIRS` at the measured rate."""
    F = parsed_flags
    for name, value in (("train_seconds", 30.0), ("batch_size", 64), ("steps_per_execution", 2),
                        ("quick_knn_train", 5000)):
        F[name].value = value

    def fit_first_steps(n, timer):
        for execution in range(n // 2):
            timer.on_train_batch_end(2 * execution + 1)

    monkeypatch.setattr(program.time, "perf_counter", FakeClock(0.5))  # 256 pairs/s
    assert program.budget_steps(fit_first_steps) == 120
    # 25,600 pairs at 256 pairs/s: 100 s.
    out = capsys.readouterr().out
    assert "Note: 7,680 pairs are few" in out and "--train_seconds=100 trains 25,600" in out
    (tmp_path / "more").mkdir()
    F["train_seconds"].value, F["model_dir"].value = 100.0, str(tmp_path / "more")
    assert program.budget_steps(fit_first_steps) == 400
    assert "Note:" not in capsys.readouterr().out


def test_a_budgeted_cli_run_records_its_size_and_resumes_with_it(tmp_path, cifar10_dir):
    run = train(tmp_path / "run", cifar10_dir, "--train_seconds=4", "--export=false",
                "--checkpoint_every_steps=1000")
    line = re.search(r"--train_steps=(\d+) of 16 pairs", run.stdout)
    assert line, run.stdout[-2000:]
    recorded = json.loads((tmp_path / "run" / "budget.json").read_text())
    assert recorded["train_steps"] == int(line.group(1)) >= 1
    assert f"Done (pretext): steps={recorded['train_steps']}," in run.stdout
    again = train(tmp_path / "run", cifar10_dir, "--train_seconds=4", "--export=false")
    assert "Time budget" not in again.stdout  # the recorded size, no new measurement
    assert f"steps={recorded['train_steps']}, start_step={recorded['train_steps']}" in again.stdout


def test_another_budget_for_a_recorded_run_is_refused(parsed_flags):
    (pathlib.Path(parsed_flags.model_dir) / "budget.json").write_text(
        json.dumps({"train_seconds": 150.0, "train_steps": 503}))
    parsed_flags["train_seconds"].value = 60.0
    with pytest.raises(UsageError, match="--train_seconds=60 differs from the 150.0"):
        program.recorded_budget()
    parsed_flags["train_seconds"].value = 150.0
    assert program.recorded_budget()["train_steps"] == 503
