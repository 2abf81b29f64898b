"""Mistakes that crashed or passed for success: a folder's non-UTF-8 file name and looping link,
a batch larger than the machine's memory, a finite divergence, the words of a stopped run, an
undeclared import (docs/reliability.md, "Trust: links and files of others").

The command line runs in-process (`program`, conftest.py: `aetv2_tf.train.main` with parsed
flags), as the audit ran it; the pieces (`step_memory`) directly (the loss growth's stop in
process: test_run_control.py).
"""

from __future__ import annotations

import ast
import importlib.metadata
import io
import logging
import math
import os
import pathlib
import re
import sys

import numpy as np
import pytest

from aetv2_tf.errors import UsageError

REPO = pathlib.Path(__file__).resolve().parents[1]


def _grey_png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.full((40, 40, 3), 128, np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def _quick(*args: str) -> tuple[str, ...]:
    return (f"--flagfile={REPO / 'configs' / 'quickstart.cfg'}", "--train_seconds=0",
            "--quick_knn_train=0", "--export=false", *args)


# --------------------------------------------------------------------------- a folder data set
def test_a_non_utf8_file_name_and_a_looping_class_link_are_named_before_anything_is_written(
        tmp_path, program, capsys):
    """A folder data set with an image named by non-UTF-8 bytes, then one whose class folder is
    a link to itself: exit 2 each, the name shown with its bytes escaped (\\xe9), nothing
    written (before: a ValueError traceback from the tf.data pipeline after flags.json was
    written; an OSError traceback, "Too many levels of symbolic links")."""
    root = tmp_path / "images"
    for name in ("a", "b"):
        (root / "train" / name).mkdir(parents=True)
        (root / "train" / name / "1.png").write_bytes(_grey_png())
    bad = os.path.join(os.fsencode(root / "train" / "a"), b"caf\xe9.png")
    with open(bad, "wb") as f:
        f.write(_grey_png())
    args = _quick("--dataset=folder", "--backbone=nin", f"--data_dir={root}", "--batch_size=2",
                  "--train_steps=1")
    code = program(*args, f"--model_dir={tmp_path / 'run1'}")
    err = capsys.readouterr().err
    assert code == 2 and "caf\\xe9.png is not valid UTF-8" in err and "rename it" in err, err
    assert "Traceback" not in err and not (tmp_path / "run1").exists()
    os.remove(bad)
    (root / "train" / "loop").symlink_to("loop")
    code = program(*args, f"--model_dir={tmp_path / 'run2'}")
    err = capsys.readouterr().err
    assert code == 2 and "loop is a symbolic link to loop that cannot be followed" in err, err
    assert "Traceback" not in err and not (tmp_path / "run2").exists()


# ------------------------------------------------------------------------ a batch over memory
def test_the_step_memory_estimate_counts_the_encoders_activations():
    """`step_memory.ACTIVATIONS` is every layer output of the built encoders, per image."""
    from aetv2_tf.models import BACKBONES, build_backbone
    from aetv2_tf.program import step_memory

    for name, count in step_memory.ACTIVATIONS.items():
        encoder = build_backbone(name, BACKBONES[name].input_shape, batch_norm="keras")
        outputs = [t for layer in encoder.layers for t in
                   (layer.output if isinstance(layer.output, (list, tuple)) else [layer.output])]
        assert sum(math.prod(t.shape[1:]) for t in outputs) == count, name


def test_a_batch_over_the_machines_memory_is_refused_and_normal_configs_pass(
        tmp_path, cifar10_dir, program, capsys):
    """`--batch_size=50000` on CIFAR-10 (NIN): exit 2 before anything is written, the estimate
    and how it is made in the message (before: a segmentation fault, exit 139, at 6.1 GB, no
    word). On a 16 GB machine the configs' batches pass: NIN 512 (AET and RotNet) and AlexNet
    768; a GPU's memory is not judged here."""
    from aetv2_tf.program import step_memory

    code = program(*_quick(f"--data_dir={cifar10_dir}", "--batch_size=50000", "--train_steps=1",
                           f"--model_dir={tmp_path / 'run'}"))
    err = capsys.readouterr().err
    assert code == 2, err
    assert re.search(r"--batch_size=50000: a training step needs about [\d,.]+ GB \(2 x "
                     r"--batch_size images .* x 2,252,928 activation values of the nin encoder "
                     r"per image x 4 bytes, plus 1 GiB\), more than this machine's", err), err
    assert "Lower --batch_size" in err and not (tmp_path / "run").exists()
    sixteen = 16 * 2**30
    for backbone, batch, rotation in (("nin", 512, False), ("nin", 512, True),
                                      ("alexnet", 768, False)):
        step_memory.check_step_memory(backbone, batch, rotation, False, memory=sixteen)
    with pytest.raises(UsageError, match=r"about 9\d\d fits here"):
        step_memory.check_step_memory("alexnet", 2000, False, False, memory=sixteen)
    step_memory.check_step_memory("nin", 50000, False, True, memory=sixteen)  # an accelerator


# ------------------------------------------------------------------- a divergence, the words
@pytest.mark.slow
def test_a_loss_that_grows_past_the_factor_stops_with_exit_7_keeping_the_last_good_checkpoint(
        tmp_path, cifar10_dir, program, capsys):
    """As the audit ran it: `--learning_rate=1e6` (here resumed from a good checkpoint with
    --allow_flag_changes): exit 7, the loss and the factor named, no checkpoint of the
    diverged weights, the newest the last good one, named (before: exit 0, loss 7.2e13).
    A stop before any checkpoint (`--learning_rate=1e30`, exit 3) says "no checkpoint was
    written", never "the one of step None": `test_optim.py::test_exit_codes` and below."""
    run = tmp_path / "run"
    args = _quick(f"--data_dir={cifar10_dir}", "--batch_size=16", "--train_examples=256",
                  "--train_steps=8", "--checkpoint_every_steps=1", f"--model_dir={run}")
    assert program(*args, "--stop_after_steps=2") == 0
    capsys.readouterr()
    code = program(*args, "--learning_rate=1e6", "--allow_flag_changes")
    err = capsys.readouterr().err
    assert code == 7, err
    assert re.search(r"the loss grew to \S+ at step \d, \S+ times its first logged value", err)
    assert f"{run / 'checkpoints' / 'ckpt-2.weights.h5'} (step 2), holds the last good" in err
    # ckpt-3 holds the weights after the first step at 1e6, which gave the grown loss: set aside
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "ckpt-1.weights.h5", "ckpt-1.weights.h5.sha256", "ckpt-2.weights.h5",
        "ckpt-2.weights.h5.sha256", "ckpt-3.weights.h5.bad", "ckpt-3.weights.h5.bad.sha256"]


# -------------------------------------------------------------------- a run that changed nothing
@pytest.mark.parametrize("stage", ["pretext", "supervised"])
def test_a_stage_whose_steps_change_no_weight_is_not_done(stage, tmp_path, cifar10_dir,
                                                          program, capsys, monkeypatch):
    """An optimizer whose steps change no trainable weight (as under --learning_rate=1e-300 or
    --adam_beta2=1.0: here its update made a no-op): the pretraining's steps and the
    supervised stage's epochs run, then exit 8 naming the likely causes and their fixes, never
    `Done`."""
    from aetv2_tf.method.optimizers import CoupledWeightDecay

    monkeypatch.setattr(CoupledWeightDecay, "update_step", lambda self, *args: None)
    data = (f"--data_dir={cifar10_dir}", "--batch_size=16", f"--model_dir={tmp_path / 'run'}")
    args = _quick(*data, "--train_examples=64", "--train_steps=2") if stage == "pretext" else \
        (f"--flagfile={REPO / 'configs' / 'cifar10_supervised.cfg'}", *data, "--epochs=1",
         "--train_examples=64", "--val_examples=16", "--test_examples=16")
    code = program(*args)
    out, err = capsys.readouterr()
    assert code == 8 and "Done" not in out, (out, err)
    assert "changed no trainable weight" in err and "--learning_rate" in err, err
    assert "--adam_beta2" in err and "frozen" in err, err


# -------------------------------------------------------------------- a folder of one image
def test_a_folder_of_one_image_trains_with_its_image_summaries(tmp_path, program, capsys,
                                                                caplog):
    """One image and --batch_size=1: the pretraining runs, its image summaries drawing the one
    image (before: a ValueError traceback, "batch_size 4 exceeds the 1 training images");
    --batch_size=2 is refused with both numbers and the fix. The files beside it that it does
    not read are named, as under JAX (test_jax_cli.py, the folder pretraining)."""
    images = tmp_path / "images" / "train" / "a"
    images.mkdir(parents=True)
    (images / "1.png").write_bytes(_grey_png())
    (images / "photo.webp").write_bytes(b"RIFF")
    (images / "zero.jpg").symlink_to("/dev/zero")
    args = _quick("--dataset=folder", "--backbone=nin", f"--data_dir={tmp_path / 'images'}",
                  "--train_steps=1")
    code = program(*args, "--batch_size=2", f"--model_dir={tmp_path / 'run2'}")
    err = capsys.readouterr().err
    assert code == 2 and "--batch_size=2: a step takes 2 training images" in err, err
    assert "the data has only 1" in err and "lower --batch_size" in err, err
    with caplog.at_level(logging.WARNING):
        code = program(*args, "--batch_size=1", f"--model_dir={tmp_path / 'run'}")
    out, err = capsys.readouterr()
    assert code == 0 and "Done (pretext): steps=1" in out, (out, err)
    assert "Traceback" not in err
    assert "Left out 2 file(s)" in caplog.text and "photo.webp (unsupported format .webp" in \
        caplog.text and "zero.jpg (not a regular file" in caplog.text, caplog.text


# ----------------------------------------------------------------------- what the package needs
def test_every_library_import_is_a_declared_dependency():
    """Every third-party module the package imports (at the top or inside a function) comes
    from a distribution pyproject.toml declares (before: Pillow, imported by the folder reader
    under Keras on JAX, was only a test extra)."""
    text = (REPO / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    declared = {re.match(r"[A-Za-z0-9_.-]+", s).group(0).lower().replace("_", "-")
                for s in re.findall(r'"([^"]+)"', block)}
    distributions = importlib.metadata.packages_distributions()
    missing = {}
    for path in (REPO / "aetv2_tf").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for top in {n.split(".")[0] for n in names if n}:
                if top in sys.stdlib_module_names or top == "aetv2_tf":
                    continue
                dists = {d.lower().replace("_", "-") for d in distributions.get(top, [top])}
                if not dists & declared:
                    missing.setdefault(top, str(path.relative_to(REPO)))
    assert not missing, f"imported but not in [project] dependencies: {missing}"
