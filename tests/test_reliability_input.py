"""Bad input: `python -m aetv2_tf.train` stops at once with a clear error and writes nothing.

Every case is a real command line (docs/reliability.md lists them). The expected outcome: a
non-zero exit (1 for what absl rejects while parsing flags, 2 for what the program rejects), a
message on stderr that names the problem (and its fix), no traceback, and no `--model_dir` at
all: flags, data and the model_dir are checked before anything is written. What absl refuses
(and the two logical CPU devices, which only a fresh process can configure) runs as
`python -m aetv2_tf.train` in a subprocess, two at a time in one module fixture; the program's
own refusals run in this process (`program`, conftest.py: `aetv2_tf.train.main` with the parsed
command line, which prints the same `error: ...` and exits 2), without a child's ~4 CPU-s of
imports each.
"""

from __future__ import annotations

import concurrent.futures
import json
import pathlib
import pickle
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from aetv2_tf.program import rundir
from aetv2_tf.program.rundir import UsageError
from tests.cli import REPO, _env, run_module, train, train_args

# A pickle that runs `touch MARKER` when loaded by a plain `pickle.load` (protocol 0 opcodes:
# push the global os.system, the argument tuple, call it).
EXPLOIT = b"cos\nsystem\n(S'touch %s'\ntR."


@dataclass(frozen=True)
class Case:
    """A bad command line (flags after the tiny-run defaults) and what it must print."""

    args: tuple[str, ...]
    message: str  # a regular expression expected in stderr
    exit_code: int = 2


def batch_dir(root: pathlib.Path, cifar10_dir: pathlib.Path, name: str, content: bytes):
    """A CIFAR-10 directory whose batches link to the real ones, except `name` = `content`."""
    root.mkdir(parents=True)
    for source in cifar10_dir.iterdir():
        (root / source.name).symlink_to(source)
    (root / name).unlink()
    (root / name).write_bytes(content)
    return root


def bad_array_batch(data: np.ndarray) -> bytes:
    return pickle.dumps({b"data": data, b"labels": [0] * len(data)}, protocol=4)


def prepare_data(tmp: pathlib.Path, cifar10_dir: pathlib.Path) -> None:
    """The bad data directories (and a regular file) that `cases` points to."""
    (tmp / "empty").mkdir()
    (tmp / "a_file").write_text("not a directory")
    # The damage is in data_batch_1, the file that every run reads (a slice of the first N
    # images, --train_examples, reads only the files that hold them).
    half = (cifar10_dir / "data_batch_1").read_bytes()
    batch_dir(tmp / "truncated", cifar10_dir, "data_batch_1", half[: len(half) // 2])
    batch_dir(tmp / "crafted", cifar10_dir, "data_batch_1", EXPLOIT % str(tmp / "PWNED").encode())
    batch_dir(tmp / "shape", cifar10_dir, "data_batch_1",
              bad_array_batch(np.zeros((16, 2048), np.uint8)))
    batch_dir(tmp / "dtype", cifar10_dir, "data_batch_1",
              bad_array_batch(np.zeros((16, 3072), np.float32)))


def cases(tmp: pathlib.Path) -> dict[str, Case]:
    """The bad inputs of the issue (paths under `tmp`, see `prepare_data`)."""
    flag_error = "FATAL Flags parsing error"
    return {
        "missing_flagfile": Case((f"--flagfile={tmp / 'missing.cfg'}",),
                                 f"{flag_error}.*Unable to open flagfile.*missing.cfg", 1),
        "unknown_flag": Case(("--bach_size=16",), "Unknown command line flag 'bach_size'", 1),
        "negative_batch_size": Case(("--batch_size=-16",), "--batch_size must be >= 1", 1),
        "negative_projection_weight": Case(("--projection_weight=-0.5",),
                                           "--projection_weight must be >= 0", 1),
        "infinite_learning_rate": Case(("--learning_rate=inf",),
                                       "--learning_rate must be a finite number", 1),
        "nan_weight_decay": Case(("--weight_decay=nan",),
                                 "--weight_decay must be a finite number", 1),
        "batch_not_divisible_by_replicas": Case(
            ("--strategy=mirrored", "--cpu_devices=2", "--batch_size=15"),
            "--batch_size=15 is not divisible by the 2 replicas.*use a multiple of 2"),
        "unknown_dataset": Case(("--dataset=mnist",), "--dataset=mnist: value should be one of",
                                1),
        "unknown_backbone": Case(("--backbone=resnet50",),
                                 "--backbone=resnet50: value should be one of", 1),
        "alexnet_with_cifar10": Case(("--backbone=alexnet",),
                                     "--backbone=alexnet expects 224x224.*use --backbone=nin"),
        "probe_without_pretrained": Case(("--stage=probe",), "--stage=probe needs --pretrained"),
        "pretrained_missing": Case(("--stage=probe", "--probe=knn",
                                    f"--pretrained={tmp / 'no_such_run'}"),
                                   "no_such_run.*does not exist"),
        "multi_worker_without_tf_config": Case(("--strategy=multi_worker_mirrored",),
                                               "needs the TF_CONFIG environment variable"),
        "data_dir_missing": Case((f"--data_dir={tmp / 'no_data'}",),
                                 "no_data does not exist; download cifar-10-python.tar.gz"),
        "data_dir_empty": Case((f"--data_dir={tmp / 'empty'}",),
                               "holds neither the CIFAR-10 python layout.*download"),
        "data_truncated": Case((f"--data_dir={tmp / 'truncated'}",),
                               r"data_batch_1: not unpickled \(pickle data was truncated\)"
                               ".*replace it: download"),
        "data_crafted_pickle": Case((f"--data_dir={tmp / 'crafted'}",),
                                    "data_batch_1: not unpickled.*refused global os.system"
                                    ".*nothing in it was executed"),
        "data_wrong_shape": Case((f"--data_dir={tmp / 'shape'}",),
                                 r"data_batch_1: data has shape \(16, 2048\).*expected \(N, 3072"),
        "data_wrong_dtype": Case((f"--data_dir={tmp / 'dtype'}",),
                                 r"data_batch_1: data has shape \(16, 3072\) dtype float32, "
                                 r"expected \(N, 3072\) uint8"),
        "lr_drops_not_increasing": Case(("--lr_schedule=step", "--epochs=30",
                                         "--lr_drop_epochs=20,10"),
                                        "--lr_drop_epochs=20,10: increasing epochs from 1 on"),
        "lr_drops_without_step": Case(("--lr_drop_epochs=5",),
                                      "--lr_drop_epochs needs --lr_schedule=step and --epochs"),
        "model_dir_under_a_file": Case((f"--model_dir={tmp / 'a_file' / 'run'}",),
                                       "a_file/run is not writable.*choose a directory"),
    }


#: The cases that run in a child process: absl's refusals while parsing (exit 1, before the
#: program imports Keras), and two logical CPU devices (configured only before TensorFlow starts).
IN_A_CHILD = {name for name, case in cases(pathlib.Path("TMP")).items() if case.exit_code == 1} \
    | {"batch_not_divisible_by_replicas"}


@pytest.fixture(scope="module")
def bad_data(tmp_path_factory, cifar10_dir) -> pathlib.Path:
    """The folder of `prepare_data`'s bad data directories (checked afterwards: the crafted
    pickle never ran)."""
    tmp = tmp_path_factory.mktemp("bad_input")
    prepare_data(tmp, cifar10_dir)
    yield tmp
    assert not (tmp / "PWNED").exists(), "the crafted pickle was executed"


@pytest.fixture(scope="module")
def outcomes(bad_data, cifar10_dir) -> dict[str, tuple]:
    """Runs the `IN_A_CHILD` cases (two processes at a time): {name: (exit code, stderr)}."""
    bad = cases(bad_data)

    def run(name: str) -> subprocess.CompletedProcess:
        args = train_args(bad_data / "runs" / name, cifar10_dir, "--train_steps=2",
                          *bad[name].args)
        return run_module("aetv2_tf.train", *args, timeout=300, check=False)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        procs = dict(zip(IN_A_CHILD, pool.map(run, IN_A_CHILD), strict=True))
    return {name: (proc.returncode, proc.stderr) for name, proc in procs.items()}


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.slow) if name in IN_A_CHILD else name
    for name in cases(pathlib.Path("TMP"))])
def test_bad_input_is_refused_before_anything_is_written(name, bad_data, cifar10_dir, request,
                                                         capsys):
    case, model_dir = cases(bad_data)[name], bad_data / "runs" / name
    if name in IN_A_CHILD:
        code, stderr = request.getfixturevalue("outcomes")[name]
    else:
        program = request.getfixturevalue("program")
        code = program(*train_args(model_dir, cifar10_dir, "--train_steps=2", *case.args))
        stderr = capsys.readouterr().err
    detail = f"exit {code}\n{stderr[-2500:]}"
    assert code == case.exit_code, detail
    assert re.search(case.message, stderr, re.S), detail
    assert "Traceback" not in stderr, detail
    assert not model_dir.exists(), f"{model_dir} was created"


# ----------------------------------------------------------------- a model_dir of another run
@pytest.mark.slow
def test_model_dir_of_another_run_is_refused_unless_overwrite(tmp_path, cifar10_dir,
                                                              finished_run, program, capsys):
    """Other essential flags in an existing model_dir (a copy of conftest.py's finished run):
    refused, naming each differing flag and leaving the run untouched; `--overwrite` then
    starts afresh there. In-process (`program`: the command line without the interpreter
    start)."""
    model_dir = pathlib.Path(shutil.copytree(finished_run[0], tmp_path / "run", symlinks=True))
    before = {p.name: p.read_bytes() for p in model_dir.rglob("*") if p.is_file()}
    other = ("--batch_size=32", "--projection_weight=0.5")
    code = program(*train_args(model_dir, cifar10_dir, "--train_steps=2", "--export=false",
                               *other))
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert "holds a run with different essential flags" in err
    assert "--batch_size: saved 16, now 32" in err
    assert "--projection_weight: saved 10.0, now 0.5" in err  # quickstart: 10
    assert "--overwrite" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in model_dir.rglob("*") if p.is_file()} == before

    assert program(*train_args(model_dir, cifar10_dir, "--train_steps=1", "--export=false",
                               *other, "--overwrite")) == 0
    assert json.loads((model_dir / "flags.json").read_text())["batch_size"] == 32
    assert sorted(p.name for p in (model_dir / "checkpoints").glob("*.weights.h5")) == [
        "ckpt-1.weights.h5"]


# ------------------------------------------------------------------------------ a full disk
def test_full_disk_fails_at_start_up(tmp_path, monkeypatch):
    """A disk with less free space than a checkpoint needs is refused by `rundir.prepare` (which
    `stages.run` calls before building anything), and the new model_dir is removed
    again.
    In-process: `shutil.disk_usage` reports 1 MiB free (mounting a small tmpfs needs root
    privileges that CI does not have)."""
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda path: real(path)._replace(free=2**20))
    model_dir = tmp_path / "run"
    with pytest.raises(UsageError, match=r"has only 1.0 MiB free; checkpoints need at least 64"):
        rundir.prepare(str(model_dir), {"stage": "pretext"}, "--stage=pretext\n",
                       ("stage",), overwrite=False)
    assert not model_dir.exists()


def test_the_disk_check_is_sized_from_the_model(tmp_path, monkeypatch, configured):
    """`disk_bytes_needed` bounds the real size of a checkpoint file from above (by at most
    its 2 % + 1 MiB margin); an AlexNet run (about 650 MB a checkpoint with Adam) is refused
    before its first step on a disk with 1 GiB free, naming what needs the space."""
    import keras
    import numpy as np

    from aetv2_tf.models import build_aet_model, build_backbone
    from aetv2_tf.program import pretext_stage
    from aetv2_tf.program.keras_checkpoints import disk_bytes_needed, variables_bytes

    def compiled(backbone, size):
        encoder = build_backbone(backbone, (size, size, 3), batch_norm="keras")
        model = build_aet_model(encoder)
        model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
        model.optimizer.build(model.trainable_variables)
        return encoder, model

    encoder, model = compiled("nin", 32)
    model.save_weights(tmp_path / "ckpt.weights.h5")
    real_size = (tmp_path / "ckpt.weights.h5").stat().st_size
    one = disk_bytes_needed(model, encoder, keep=0, export=False) - variables_bytes(
        encoder.weights) * 1.02
    assert real_size <= one <= real_size * 1.05 + 2**20, (real_size, one)
    weights = sum(int(np.prod(w.shape)) for w in model.weights)
    assert variables_bytes(model.weights) == 4 * weights  # float32

    encoder, model = compiled("alexnet", 224)
    needed = disk_bytes_needed(model, encoder, keep=3, export=True)
    assert 3.3e9 < needed < 4.3e9  # 5 checkpoints of ~680 MB, the encoder 3 times
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=2**30))
    config = configured(f"--model_dir={tmp_path}", "--train_steps=1")
    with pytest.raises(UsageError, match=r"1024.0 MiB free; 3 \+ 1 checkpoints of this model, "
                                         r"the final encoder and the export need at least"):
        pretext_stage.check_disk(config, model, encoder)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_a_failed_export_exits_4_on_every_backend(backend, tmp_path, cifar10_dir):
    """The SavedModel cannot be written (a file stands where its folder goes): the training and
    the encoder are kept, the program says how to redo the export and exits 4, not 0."""
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / "export").write_text("a file where the export folder goes")
    proc = train(model_dir, cifar10_dir, "--train_steps=1", "--export=true",
                 check=False, env={"KERAS_BACKEND": backend})
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert "export failed" in proc.stderr and "python -m aetv2_tf.export" in proc.stderr
    assert (model_dir / "encoder.weights.h5").is_file()


@pytest.mark.slow
def test_resuming_with_other_trajectory_flags_is_refused_unless_allowed(tmp_path, cifar10_dir,
                                                                        program, capsys):
    """A run trained to step 2, resumed with another learning rate and length: refused (exit 2,
    both flags listed, nothing changed); with --allow_flag_changes it trains on, the change is
    appended to flags_history.jsonl with its step, and flags.json still holds the first record.
    The first run is a command line; the others run in-process (`program`)."""
    model_dir = tmp_path / "run"
    base = ("--checkpoint_every_steps=2", "--export=false")
    train(model_dir, cifar10_dir, *base, "--stop_after_steps=2")
    first = (model_dir / "flags.json").read_bytes()
    changed = ("--learning_rate=0.01", "--train_steps=6")
    code = program(*train_args(model_dir, cifar10_dir, *base, *changed))
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert "trained to step 2" in err and "--learning_rate: 0.0003 until now, 0.01 " \
        "asked" in err and "--train_steps: 8 until now, 6 asked" in err
    assert (model_dir / "flags.json").read_bytes() == first
    assert not (model_dir / "flags_history.jsonl").exists()
    assert program(*train_args(model_dir, cifar10_dir, *base, *changed,
                               "--allow_flag_changes")) == 0
    out = capsys.readouterr().out
    assert "Flags changed from step 2 on" in out and "steps=6" in out
    history = [json.loads(line) for line in
               (model_dir / "flags_history.jsonl").read_text().splitlines()]
    assert history == [{"step": 2, "changed": {"learning_rate": [0.0003, 0.01],
                                               "train_steps": [8, 6]}}]
    assert (model_dir / "flags.json").read_bytes() == first
    assert "--learning_rate=0.01" in (model_dir / "flags.cfg").read_text()
    # the accepted values are now the run's: resuming with them needs nothing more
    assert program(*train_args(model_dir, cifar10_dir, *base, *changed)) == 0
    assert "Flags changed" not in capsys.readouterr().out


def test_flag_errors_answer_before_keras_is_imported():
    """absl refuses a bad command line before the program imports Keras and TensorFlow (~4 s
    of CPU): exit 1, the message, and neither module (nor JAX) imported when the child exits."""
    code = ("import runpy, sys\ntry:\n    runpy.run_module('aetv2_tf.train', run_name='__main__',"
            " alter_sys=True)\nfinally:\n    print('imported:', [m for m in ('keras', "
            "'tensorflow', 'jax') if sys.modules.get(m) is not None])")  # None: hidden
    for flag, message in (("--bach_size=16", "Unknown command line flag 'bach_size'"),
                          ("--learning_rate=inf", "--learning_rate must be a finite number")):
        proc = subprocess.run([sys.executable, "-c", code, flag], cwd=REPO, env=_env({}),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1 and message in proc.stderr, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr and "imported: []" in proc.stdout, proc.stdout
        assert "Pass --helpshort or --helpfull to see help on flags." in proc.stderr


def test_help_describes_the_essential_flags_by_purpose():
    """``--help`` and ``--helpshort`` (which a parse error points to) show the README's flags,
    grouped by purpose, each described, without importing Keras (`train.KEY_FLAGS`)."""
    from aetv2_tf.train import KEY_FLAGS

    names = [name for _, group in KEY_FLAGS for name in group]
    assert {"flagfile", "stage", "model_dir", "data_dir", "batch_size", "epochs", "train_steps",
            "train_seconds", "learning_rate", "pretrained", "probe", "feature", "backbone",
            "dataset", "export"} <= set(names)
    for flag in ("--help", "--helpshort"):
        proc = subprocess.run([sys.executable, "-m", "aetv2_tf.train", flag], cwd=REPO,
                              env=_env({}), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        usage, _, described = proc.stdout.partition("\nflags:\n")
        for group, flags in KEY_FLAGS:  # grouped: one line per purpose
            assert f"  {group}:" in usage and " ".join(f"--{n}" for n in flags) in usage
        for name in names:  # each described below
            assert f"\n  --{name}: " in described or f"\n  --[no]{name}: " in described, name
