"""No output inside an input, no input inside an output, and nothing written over what the
project did not write: the training program's --model_dir against --data_dir and --pretrained,
the export's --output against its run and the run's data, the report's --output against the
runs it reads, `save_encoder` against a run's folder, and the readers of a run that is training
now.

In-process (`aetv2_tf.train.main` with parsed flags, `aetv2_tf.report.main`, the library);
`python -m aetv2_tf.export` as a subprocess for its exit code. "Nothing written" is checked
byte for byte (`tree`).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

import aetv2_tf
from aetv2_tf import report
from aetv2_tf.errors import UsageError
from aetv2_tf.probes.results import write_results
from tests.cli import PROBE_SLICE, REPO, run_module
from tests.folders import make_result, tree, write_image_folder

QUICK = (f"--flagfile={REPO / 'configs' / 'quickstart.cfg'}", "--batch_size=16",
         "--train_examples=256", "--quick_knn_train=0", "--train_seconds=0", "--train_steps=4",
         "--checkpoint_every_steps=2")


@pytest.fixture(scope="module")
def saved_encoder_dir(tmp_path_factory) -> pathlib.Path:
    """A NIN encoder saved by `save_encoder` (random weights): a --pretrained and an export
    source whose reading takes seconds. Read it, never write into it."""
    return pathlib.Path(aetv2_tf.save_encoder(aetv2_tf.build_backbone("nin"),
                                              str(tmp_path_factory.mktemp("saved") / "enc")))


def copied_run(source: pathlib.Path, target: pathlib.Path, **record) -> pathlib.Path:
    """A copy of `source` whose flags.json has the keys of `record` added (e.g. a data_dir)."""
    import shutil

    shutil.copytree(source, target)
    flags = json.loads((target / "flags.json").read_text())
    (target / "flags.json").write_text(json.dumps({**flags, **record}))
    return target


def test_a_model_dir_inside_a_folder_data_set_is_refused_before_anything_is_written(
        tmp_path, program, capsys):
    """`--model_dir=ROOT/train/myrun --dataset=folder --data_dir=ROOT` would make the run a class
    of the data set (and every rerun refused): exit 2 naming both paths and the fix, the data
    byte-identical; a --data_dir inside the --model_dir is refused the same way."""
    root = tmp_path / "images"
    write_image_folder(root, {"train": 3})
    before = tree(root)
    code = program(*QUICK, "--dataset=folder", f"--data_dir={root}",
                   f"--model_dir={root / 'train' / 'myrun'}")
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"--model_dir={root / 'train' / 'myrun'} lies inside --data_dir={root}" in err, err
    assert "choose another --model_dir" in err and "nothing was written" in err
    assert tree(root) == before
    code = program(*QUICK, "--dataset=folder", f"--data_dir={root}", f"--model_dir={tmp_path}")
    err = capsys.readouterr().err
    assert code == 2 and f"--model_dir={tmp_path} holds --data_dir={root}" in err, err
    assert tree(root) == before and sorted(p.name for p in tmp_path.iterdir()) == ["images"]


def test_a_probe_inside_its_pretrained_run_is_refused(tmp_path, saved_encoder_dir, program,
                                                     cifar10_dir, capsys):
    """A probe's --model_dir inside the --pretrained run (its outputs mixed with the run's, and
    set aside with it by the run's --overwrite): exit 2, the run byte-identical."""
    run = copied_run(saved_encoder_dir, tmp_path / "run")
    before = tree(run)
    code = program("--stage=probe", "--probe=knn", f"--pretrained={run}",
                   f"--model_dir={run / 'knn'}", f"--data_dir={cifar10_dir}", *PROBE_SLICE)
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"--model_dir={run / 'knn'} lies inside --pretrained={run}" in err, err
    assert tree(run) == before


def export(*args: str) -> subprocess.CompletedProcess:
    return run_module("aetv2_tf.export", *args, check=False, timeout=300)


def test_an_export_inside_its_run_or_its_data_is_refused(tmp_path, saved_encoder_dir):
    """`python -m aetv2_tf.export --output=` inside the data the run read (a class of a folder
    data set) or inside the run but not under its export/ (its checkpoints/: the run is then
    refused for a foreign file): exit 2 before any work, nothing written. The default output
    (RUN/export/encoder) is still written."""
    data = tmp_path / "images"
    write_image_folder(data, {"train": 2})
    run = copied_run(saved_encoder_dir, tmp_path / "run", data_dir=str(data))
    before, data_before = tree(run), tree(data)
    for output, message in ((data / "train" / "exported", "lies inside the run's --data_dir"),
                            (run / "checkpoints" / "encoder", f"lies inside --model_dir={run}")):
        proc = export(f"--model_dir={run}", f"--output={output}")
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert f"--output={output} {message}" in proc.stderr, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
        assert tree(run) == before and tree(data) == data_before
    proc = export(f"--model_dir={run}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (run / "export" / "encoder" / "saved_model.pb").is_file()


def test_the_report_is_never_written_into_a_run_it_reads(tmp_path, capsys):
    """`python -m aetv2_tf.report RUN --output=RUN/report.md` (a file in the probe's run) and
    `--output=RUN/results.json --overwrite` (the results it reads): exit 2, nothing written; a
    report beside the runs is written."""
    run = tmp_path / "runs" / "knn"
    write_results(run, make_result("knn", 20.0, method="AETv2"))
    before = tree(run)
    for output, overwrite in ((run / "report.md", False), (run / "results.json", True)):
        assert report.main(["report", str(tmp_path / "runs")], str(output), overwrite) == 2
        err = capsys.readouterr().err
        assert f"--output={output} lies inside the run folder {run}" in err, err
        assert tree(run) == before
    assert report.main(["report", str(tmp_path / "runs")], str(tmp_path / "runs" / "r.md")) == 0
    assert (tmp_path / "runs" / "r.md").is_file()


def test_save_encoder_never_replaces_a_run_or_files_it_did_not_write(tmp_path):
    """`save_encoder(encoder, RUN)` on a training run's folder (its flags.json and trained
    encoder.weights.h5) or on a folder of other files: UsageError, nothing written, even with
    overwrite=True; an encoder that save_encoder wrote is replaced only with overwrite=True."""
    encoder = aetv2_tf.build_backbone("nin")
    run = tmp_path / "run"
    run.mkdir()
    (run / "flags.json").write_text(json.dumps({"stage": "pretext", "backbone": "nin"}))
    (run / "encoder.weights.h5").write_bytes(b"trained weights")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine\n")
    for folder, what in ((run, "a training run's folder"), (notes, "a folder of other files")):
        before = tree(folder)
        for overwrite in (False, True):
            with pytest.raises(UsageError, match=f"is {what} .*nothing was written.*pass a new "
                                                 "folder"):
                aetv2_tf.save_encoder(encoder, str(folder), overwrite=overwrite)
            assert tree(folder) == before
    saved = aetv2_tf.save_encoder(encoder, str(tmp_path / "enc"))
    before = tree(pathlib.Path(saved))
    with pytest.raises(UsageError, match="holds an encoder saved before.*overwrite=True"):
        aetv2_tf.save_encoder(encoder, saved)
    assert tree(pathlib.Path(saved)) == before
    assert aetv2_tf.save_encoder(encoder, saved, recipe="aetv1", overwrite=True) == saved
    assert json.loads((tmp_path / "enc" / "flags.json").read_text())["loss"] == "mse"


def hold_lock(run: pathlib.Path) -> subprocess.Popen:
    """A process that holds `run`'s lock as a training run does (`rundir.lock`), until killed."""
    code = ("import sys; from aetv2_tf.program import rundir; rundir.lock(sys.argv[1]); "
            "print('locked', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(run)], cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_the_run_that_holds_the_lock_exports_itself_through_a_child(tmp_path, saved_encoder_dir):
    """The export a run starts in a child process (Keras on JAX exports through TensorFlow
    there) reads the run its parent holds: its exit 0, the SavedModel written."""
    run = copied_run(saved_encoder_dir, tmp_path / "run")
    code = ("import subprocess, sys; from aetv2_tf.program import rundir; rundir.lock(sys.argv[1]);"
            " sys.exit(subprocess.run([sys.executable, '-m', 'aetv2_tf.export', "
            "'--model_dir=' + sys.argv[1]]).returncode)")
    proc = subprocess.run([sys.executable, "-c", code, str(run)], cwd=REPO, text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (run / "export" / "encoder" / "saved_model.pb").is_file()


def test_a_run_that_is_training_is_named_as_such_by_the_export_and_the_probe(
        tmp_path, saved_encoder_dir, program, cifar10_dir, capsys):
    """The export or a probe of a run that is training now (its checkpoints change under a
    reader): exit 2, `is a run that is training now (pid N ...)`, nothing written; once the run
    ends, the export reads it."""
    run = copied_run(saved_encoder_dir, tmp_path / "run")
    holder = hold_lock(run)
    try:
        proc = export(f"--model_dir={run}")
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert f"is a run that is training now (pid {holder.pid} on host" in proc.stderr
        code = program("--stage=probe", "--probe=knn", f"--pretrained={run}",
                       f"--model_dir={tmp_path / 'knn'}", f"--data_dir={cifar10_dir}",
                       *PROBE_SLICE)
        err = capsys.readouterr().err
        assert code == 2 and f"--pretrained={run} is a run that is training now" in err, err
        assert not (run / "export").exists() and not (tmp_path / "knn").exists()
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert export(f"--model_dir={run}").returncode == 0
