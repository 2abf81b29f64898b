"""Nothing through a link, nothing the program did not write: the run folder's parts, the lock,
the report's --output and an export's scratch folders (docs/reliability.md, "Trust: links and
files of others").

In-process: `rundir.prepare` (what every start calls before it writes), `aetv2_tf.train.main`
with parsed flags (`program`, conftest.py: the command line without the interpreter start), the
report's `main` and `provenance.replace_export`. Every "nothing touched" is checked byte for byte.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from aetv2_tf.program import rundir
from aetv2_tf.program.rundir import UsageError
from tests.cli import REPO
from tests.folders import ESSENTIAL, run_flags, tree


def _prepare(model_dir: pathlib.Path, overwrite: bool = False) -> None:
    rundir.prepare(str(model_dir), run_flags(), "--batch_size=16\n", ESSENTIAL, overwrite)


def another_run(root: pathlib.Path) -> pathlib.Path:
    """A folder of another run's checkpoint and a user's notes."""
    root.mkdir(parents=True)
    (root / "ckpt-1.weights.h5").write_bytes(os.urandom(2000))
    (root / "notes.txt").write_text("my notes\n")
    return root


def dead_pid() -> int:
    """The pid of a process that has ended."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(proc.stdout)


# --------------------------------------------------------- the run folder's parts, in-process
@pytest.mark.parametrize("part", [".lock", "checkpoints", "train", "export",
                                  "encoder.weights.h5", "results.json", "flags.json"])
@pytest.mark.parametrize("overwrite", [False, True], ids=["", "overwrite"])
def test_a_part_of_the_run_that_is_a_link_is_refused_before_anything_is_written(
        part, overwrite, tmp_path):
    """A model_dir whose lock, checkpoints/, train/, export/, encoder.weights.h5, results.json or
    flags.json is a symbolic link: UsageError naming the link, its target and the fix, with or
    without --overwrite; the target and the model_dir byte-identical (before: the lock was
    truncated and rewritten through the link, a linked checkpoints/ adopted and pruned)."""
    elsewhere = another_run(tmp_path / "elsewhere")
    run = tmp_path / "run"
    run.mkdir()
    target = elsewhere if part in ("checkpoints", "train", "export") else elsewhere / "notes.txt"
    (run / part).symlink_to(target)
    before, before_run = tree(elsewhere), tree(run)
    with pytest.raises(UsageError, match=rf"{part} -> {target}.*nothing was written.*remove the "
                                         "link"):
        _prepare(run, overwrite)
    assert tree(elsewhere) == before and tree(run) == before_run


def test_the_lock_is_never_opened_through_a_link(tmp_path):
    """`rundir.lock` itself (a link planted after `prepare`'s checks): refused, O_NOFOLLOW."""
    user_file = tmp_path / "user.txt"
    user_file.write_text("mine\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".lock").symlink_to(user_file)
    with pytest.raises(UsageError, match=r"\.lock is a symbolic link"):
        rundir.lock(str(tmp_path / "run"))
    assert user_file.read_text() == "mine\n"


@pytest.mark.parametrize("inside", ["link_file", "link_folder", "notes"])
def test_links_and_foreign_files_in_the_run_folders_are_refused(inside, tmp_path):
    """A run's checkpoints/ holding a link (to a file or a folder, whatever its name) or a file
    no run writes: refused, naming it (before: links inside were followed when read, and a
    checkpoint-named link pruned like a checkpoint)."""
    elsewhere = another_run(tmp_path / "elsewhere")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "flags.json").write_text(json.dumps(run_flags()))
    name = {"link_file": "ckpt-1.weights.h5", "link_folder": "old", "notes": "notes.txt"}[inside]
    if inside == "notes":
        (run / "checkpoints" / name).write_text("mine")
    else:
        (run / "checkpoints" / name).symlink_to(
            elsewhere / "ckpt-1.weights.h5" if inside == "link_file" else elsewhere)
    before = tree(tmp_path)
    with pytest.raises(UsageError, match=rf"did not write.*checkpoints/{name}.*Nothing was "
                                         "changed"):
        _prepare(run)
    assert tree(tmp_path) == before


@pytest.mark.parametrize("output", ["encoder.weights.h5", "checkpoints/ckpt-1.weights.h5",
                                    "aet_model.keras", "export/encoder/saved_model.pb"])
@pytest.mark.parametrize("overwrite", [False, True], ids=["", "overwrite"])
def test_run_outputs_without_flags_json_are_refused_not_adopted(output, overwrite, tmp_path):
    """A model_dir without flags.json (the record every start writes first) that holds a run's
    outputs: a user's encoder.weights.h5, another program's checkpoint, ...: refused, with or
    without --overwrite, naming them and the fix; nothing written (before: adopted: the
    checkpoint resumed and pruned, the weights replaced without a word)."""
    run = tmp_path / "run"
    (run / output).parent.mkdir(parents=True, exist_ok=True)
    (run / output).write_bytes(os.urandom(1000))
    before = tree(run)
    with pytest.raises(UsageError, match=rf"holds run outputs \({output.split('/')[0]}\) but no "
                                         r"flags\.json.*nothing was changed"):
        _prepare(run, overwrite)
    assert tree(run) == before


def test_an_empty_or_log_only_model_dir_without_flags_json_is_a_fresh_start(tmp_path):
    """What holds no run output (an empty folder, an empty checkpoints/, a user's file beside
    the run's names) starts there as before."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "README.txt").write_text("mine")
    _prepare(run)
    assert json.loads((run / "flags.json").read_text())["batch_size"] == 16
    assert (run / "README.txt").read_text() == "mine" and (run / ".lock").is_file()


def test_the_program_refuses_a_linked_lock_and_a_linked_checkpoints_folder(
        tmp_path, cifar10_dir, program, capsys):
    """As the audit ran them, through `aetv2_tf.train.main`: `.lock` linked to a user file, then
    `checkpoints/` linked to another run's folder: exit 2 each, the message naming the link,
    the user's file and the other run byte-identical, no flags.json written (before: exit 0,
    the file read "pid N on host ...", the other run's checkpoint resumed and then pruned)."""
    elsewhere = another_run(tmp_path / "elsewhere")
    before = tree(elsewhere)
    args = (f"--flagfile={REPO / 'configs' / 'quickstart.cfg'}", "--train_seconds=0",
            "--train_steps=2", "--quick_knn_train=0", f"--data_dir={cifar10_dir}",
            "--train_examples=64", "--batch_size=16", "--export=false")
    for part, target in ((".lock", elsewhere / "notes.txt"), ("checkpoints", elsewhere)):
        run = tmp_path / f"run{part}"
        run.mkdir()
        (run / part).symlink_to(target)
        code = program(*args, f"--model_dir={run}")
        err = capsys.readouterr().err
        assert code == 2, err
        assert f"{run / part} -> {target}" in err and "Traceback" not in err
        assert sorted(os.listdir(run)) == [part]
    assert tree(elsewhere) == before


# ------------------------------------------------------------------------ the report's --output
def test_the_report_replaces_an_existing_output_only_with_overwrite_and_never_a_link(
        tmp_path, capsys):
    """`report --output=FILE` at an existing file: exit 2, the file byte-identical, unless
    --overwrite; a link to a file: exit 2 even with --overwrite, the target untouched (before:
    both were overwritten)."""
    from aetv2_tf import report
    from aetv2_tf.probes.results import write_results

    run = tmp_path / "probe"
    write_results(run, {"probe": "knn", "feature": "block2", "pretrained": "none",
                        "dataset": "cifar10", "train_examples": 10, "val_examples": 0,
                        "test_examples": 10, "selected_epoch": None, "val_top1": None,
                        "test_top1": 40.0, "test_error": 60.0, "wall_time_s": 1.0,
                        "flags": {}})
    mine = tmp_path / "mine.md"
    mine.write_text("my notes\n")
    link = tmp_path / "link.md"
    link.symlink_to(mine)
    for output, overwrite, fix in ((mine, False, "pass --overwrite"),
                                   (link, True, "is a symbolic link")):
        assert report.main(["report", str(run)], str(output), overwrite) == 2
        err = capsys.readouterr().err
        assert fix in err and "nothing was written" in err
        assert mine.read_text() == "my notes\n" and link.is_symlink()
    assert report.main(["report", str(run)], str(mine), True) == 0
    assert "knn" in mine.read_text()
    new = tmp_path / "new.md"
    assert report.main(["report", str(run)], str(new)) == 0 and new.read_text() == \
        mine.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.md", "mine.md", "new.md",
                                                          "probe"]


# ----------------------------------------------------------------- an export killed mid-write
def test_the_next_export_removes_the_scratch_folders_of_a_killed_one(tmp_path):
    """The scratch folders an export killed mid-write left beside its output (its staged copy,
    `new`, and the previous export moved aside, `old`) are removed by the next export; those of
    a live process, and one holding anything else, are kept."""
    from aetv2_tf.files.provenance import replace_export

    def write(staged: str) -> None:
        os.makedirs(os.path.join(staged, "variables"))
        pathlib.Path(staged, "saved_model.pb").write_bytes(b"graph")

    parent = tmp_path / "export"
    out = parent / "encoder"
    replace_export(write, str(out))
    dead = parent / f".encoder.tmp{dead_pid()}-abc"
    write(str(dead / "new"))  # killed while writing the new export, the old one moved aside
    os.replace(out, dead / "old")
    other = parent / f".encoder.tmp{dead_pid()}-def"
    (other / "new").mkdir(parents=True)
    (other / "mine.txt").write_text("mine")
    live = parent / f".encoder.tmp{os.getppid()}-ghi"
    (live / "new").mkdir(parents=True)
    replace_export(write, str(out))
    left = sorted(p.name for p in parent.iterdir())
    assert left == sorted(["encoder", other.name, live.name]), left
    assert (other / "mine.txt").read_text() == "mine"
