"""A user's mistakes end in a message that names the problem and the fix, never a traceback.

Issue "Trust nothing you did not write", item "No traceback for a user's mistake"
(docs/reliability.md, "Trust: a user's mistakes"): flags out of any sensible range, `~` in a
flagfile, results files that are not what the report expects, a signal during start-up. All
in-process but the last (one subprocess).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest
from absl import flags
from absl.testing import flagsaver

from aetv2_tf import report
from aetv2_tf.probes.results import write_results
from aetv2_tf.program import flag_support
from aetv2_tf.program.flags import FLAGS, program_flags
from aetv2_tf.program.rundir import UsageError
from tests.cli import REPO, _env, train_args
from tests.folders import make_result


@pytest.fixture
def parse():
    """`parse(*args)` parses the program's flags (with a --model_dir) in this process and
    returns FLAGS; every flag value and the parsed state are restored afterwards."""
    saved, was_parsed = flagsaver.save_flag_values(FLAGS), FLAGS.is_parsed()

    def run(*args: str) -> flags.FlagValues:
        FLAGS.unparse_flags()
        FLAGS(["train", "--model_dir=/nonexistent/run", *args])
        return FLAGS

    yield run
    FLAGS.unparse_flags()
    flagsaver.restore_flag_values(saved, FLAGS)
    if was_parsed:
        FLAGS.mark_as_parsed()


# ------------------------------------------------------------------- flags out of any range
@pytest.mark.parametrize("arg, message", [
    ("--train_steps=1e21", r"not a whole number: write it in digits, from 0 to 2147483647"),
    ("--train_steps=" + "1" + "0" * 21, r"--train_steps must be at most 2147483647"),
    ("--epochs=99999999999", r"--epochs must be at most 2147483647"),
    ("--seed=" + "9" * 30, r"--seed must be at most 2147483647"),
    ("--seed=-1", r"--seed must be >= 0"),
    ("--train_seconds=1e21", r"--train_seconds must be at most 31536000 \(a year\)"),
    ("--cpu_devices=100000", r"--cpu_devices must be at most 64.*pass 2 to 8"),
], ids=["train_steps_1e21", "train_steps_10e21", "epochs", "seed_huge", "seed_negative",
        "train_seconds_1e21", "cpu_devices_100000"])
def test_huge_counts_are_refused_with_the_range(parse, arg, message):
    """A count past int32 (`--train_steps=<22 digits>`, a traceback deep in TensorFlow after
    the model_dir is written if let through), `--cpu_devices=100000` (a hang before the first
    step) and `1e21` (no whole number) are refused by absl while parsing (exit 1, as every flag
    validator), naming the range."""
    with pytest.raises(flags.IllegalFlagValueError, match=message):
        parse(arg)


def test_every_integer_flag_is_bounded(parse):
    """Every integer flag of the program has the upper bound (one loop, `strict_flags`)."""
    ints = [f.name for f in program_flags() if isinstance(f.parser, flags.IntegerParser)]
    assert len(ints) > 15
    for name in ints:
        with pytest.raises(flags.IllegalFlagValueError, match=f"--{name} must be"):
            parse(f"--{name}={2**31}")


def test_cpu_devices_and_step_counts_are_bounded_below_the_flags(configured):
    """The library paths refuse too: `configure_cpu_devices` (before touching TensorFlow) and
    an --epochs whose step count passes int32 (exit 2 through `UsageError`)."""
    from aetv2_tf.program import distribute, run_length

    with pytest.raises(ValueError, match="at most 64 logical CPU devices"):
        distribute.configure_cpu_devices(100000)
    config = configured("--model_dir=/nonexistent/run", "--epochs=100000000", "--batch_size=16")
    with pytest.raises(UsageError, match=r"--epochs=100000000 of 3125 steps is .*pass fewer"):
        run_length.total_steps(config, 50000, 16)


# ------------------------------------------------------------------------- ~ in every path
def test_a_flagfile_expands_home_in_every_path_flag(configured, tmp_path, monkeypatch):
    """Every path flag is expanded when parsed, also in a flagfile (no directory named `~` in
    the working directory), and the run's flags.cfg records the expanded paths."""
    monkeypatch.setenv("HOME", str(tmp_path))
    flagfile = tmp_path / "run.cfg"
    flagfile.write_text("--model_dir=~/runs/a\n--data_dir=~/data\n--pretrained=~/runs/b\n")
    config = configured(f"--flagfile={flagfile}", "--train_steps=1")
    assert (config.outputs.model_dir, config.data.data_dir, config.probe.pretrained) == (
        f"{tmp_path}/runs/a", f"{tmp_path}/data", f"{tmp_path}/runs/b")
    assert f"--model_dir={tmp_path}/runs/a\n" in config.flagfile_text()
    assert set(flag_support.PATH_FLAGS) >= {"model_dir", "data_dir", "pretrained", "output"}
    assert flag_support.PathParser().parse("~/report.md") == f"{tmp_path}/report.md"


# ---------------------------------------------------------------- the report's input files
def results_file(root: pathlib.Path, change: dict | None = None, raw: bytes | None = None,
                 fifo: bool = False) -> pathlib.Path:
    """A valid results.json under `root` (a CIFAR-10 KNN run), then changed: keys replaced by
    `change`, the whole file by `raw` bytes, or replaced by a FIFO."""
    path = pathlib.Path(write_results(root, make_result("knn", 20.0, method="AETv2")))
    if change:
        path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    if raw is not None:
        path.write_bytes(raw)
    if fifo:
        path.unlink()
        os.mkfifo(path)
    return path


BAD_FILES = {
    "huge_float": (dict(change={"test_error": 1e308}),
                   r"'test_error' is 1e\+308, expected a number from 0 to 100"),
    "huge_int": (dict(change={"test_examples": 10**400}),
                 r"'test_examples' is 1000.*\(401 characters\), expected a whole number"),
    "string_for_a_number": (dict(change={"test_error": "12.5"}),
                            r"'test_error' is '12.5', expected a number or null"),
    "bool_for_a_count": (dict(change={"train_examples": True}),
                         r"'train_examples' is True, expected a whole number"),
    "list_for_a_name": (dict(change={"method": ["AETv2"]}),
                        r"'method' is \['AETv2'\], expected a string"),
    "deep_json": (dict(raw=b"[" * 200_000 + b"]" * 200_000), r"JSON nested too deeply"),
    "bad_utf8": (dict(raw=b'{"probe": "\xff\xfe"}'), r"not UTF-8 text \(invalid start byte"),
    "too_large": (dict(raw=b" " * (2**20 + 1)), r"larger than 1048576 bytes"),
    "fifo": (dict(fifo=True), r"not a regular file"),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_the_report_refuses_a_bad_results_file_with_exit_2(name, tmp_path, capsys):
    """Before: a traceback and exit 1 for each (OverflowError, ValueError, RecursionError,
    UnicodeDecodeError), and a FIFO named results.json blocked the report forever (the FIFO
    case would hang here, not fail). Now: exit 2, the file and the problem named."""
    change, message = BAD_FILES[name]
    path = results_file(tmp_path / "runs" / name, **change)
    assert report.main(["report", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert re.search(f"aetv2_tf.report: error: {re.escape(str(path))}: {message}", err), err
    assert "fix or remove" in err or "a probe wrote" in err, err  # the fix


def test_a_fifo_given_by_name_is_refused(tmp_path, capsys):
    """A FIFO named on the command line was "no such file or directory"; now it is named for
    what it is."""
    os.mkfifo(tmp_path / "results.json")
    assert report.main(["report", str(tmp_path / "results.json")]) == 2
    assert "results.json: not a regular file" in capsys.readouterr().err


def test_nan_and_inf_are_shown_as_diverged_with_a_warning(tmp_path, capsys):
    """Before: `nan` and `inf` printed as numbers without a word, and two runs of one cell with
    an infinite value ended in a traceback (stdev). Now such a value is shown as
    `nan (diverged?)`, the file named in a warning; the other runs are reported (exit 0)."""
    nan = results_file(tmp_path / "runs" / "nan", {"test_error": float("nan")})
    results_file(tmp_path / "runs" / "ok", {"test_error": 30.0, "test_top1": 70.0})
    inf = results_file(tmp_path / "runs" / "inf", {"wall_time_s": float("inf")})
    assert report.main(["report", str(tmp_path / "runs")]) == 0
    out, err = capsys.readouterr()
    assert f"warning: {nan}: 'test_error' is nan: shown as 'nan (diverged?)'" in err
    assert f"warning: {inf}: 'wall_time_s' is inf" in err
    assert "| AETv2 | ours | nan (diverged?) (n=3) | - |" in out
    assert "| inf (diverged?) |" in out and "| 30.00 |" in out


def test_text_from_a_results_file_cannot_add_rows_to_the_tables(tmp_path, capsys):
    """Before: a newline or `|` in `method` (or `dataset`, or the path) went into the markdown as
    is, adding rows and cells. Now they are escaped: every table line keeps its column count."""
    evil = "x|y\n| AETv1 | ours | 1.00 | 1.00 | 1.00 | 1.00 | 1.00 |\n`z` <img src=q>"
    results_file(tmp_path / "runs" / "a|b`c", {"method": evil, "dataset": "cifar10\r\n# hi"})
    assert report.main(["report", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "| AETv1 | ours |" not in out.replace("\\|", "") and "\n# hi" not in out
    assert "<img" not in out and "x\\|y" in out
    tables: list[list[str]] = []
    for previous, line in zip(["", *out.splitlines()], out.splitlines(), strict=False):
        if line.startswith("|"):
            tables += [[]] if not previous.startswith("|") else []
            tables[-1].append(line)
    assert len(tables) == 2  # CIFAR-10's, all runs
    for table in tables:  # every line has the header's cells
        cells = {len(re.findall(r"(?<!\\)\|", line)) for line in table}
        assert cells == {table[0].count("|")}, table


# ------------------------------------------------------------------ a signal at start-up
def dispositions(pid: int) -> tuple[set[int], set[int]]:
    """(signals caught by a handler, signals ignored) of process `pid`, from /proc."""
    status = dict(line.split(":\t", 1) for line in
                  pathlib.Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
    def bits(mask):
        return {n + 1 for n in range(64) if int(mask, 16) >> n & 1}
    return bits(status["SigCgt"]), bits(status["SigIgn"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigint_and_sigterm_during_start_up_end_the_process_at_once(tmp_path, cifar10_dir):
    """docs/reliability.md: a signal before training starts ends the process at once with the
    default action. Before: SIGINT was Python's KeyboardInterrupt, which waits for the C call
    under way (importing TensorFlow, reading the data, tracing: "ignored" for as long) and ends
    in a traceback. Now neither SIGINT nor SIGTERM has a handler until training starts; a
    SIGINT while TensorFlow loads kills the process at once, without a traceback."""
    log = tmp_path / "train"
    with open(f"{log}.out", "w") as out, open(f"{log}.err", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aetv2_tf.train", *train_args(tmp_path / "run", cifar10_dir)],
            cwd=REPO, env=_env({"KERAS_BACKEND": "tensorflow"}), stdout=out, stderr=err,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while True:  # until TensorFlow's libraries are loading
            assert proc.poll() is None and time.monotonic() < deadline, "ended or hung"
            if "tensorflow" in pathlib.Path(f"/proc/{proc.pid}/maps").read_text():
                break
            time.sleep(0.02)
        caught, ignored = dispositions(proc.pid)  # TensorFlow is loading: start-up
        assert not {signal.SIGINT, signal.SIGTERM} & (caught | ignored), (caught, ignored)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == -signal.SIGINT
    finally:
        proc.kill()
        proc.wait()
    stderr = pathlib.Path(f"{log}.err").read_text()
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-2000:]
    assert not (tmp_path / "run" / "checkpoints").exists()
