"""The encoders this project ships (the presets of `aetv2_tf.files.presets`, docs/reproduction.md
"At scale (GPU)") stay usable: each restores its weights from the repository's git history,
loads through the same path as `--pretrained=results/scale/<name>`, and its training log is the
finished run the table reports."""

import csv
import dataclasses
import json
import pathlib
import shutil

import numpy as np
import pytest

from aetv2_tf.export import restore_encoder
from aetv2_tf.files import presets
from aetv2_tf.files.saving import CHECKSUM, file_digest


def test_the_scale_table_has_its_encoders():
    assert {p.run for p in presets.PRESETS.values()} == {
        "aetv2_recipe", "aetv2_recipe_s2", "aetv1_lr1e-4", "aetv1_lr1e-4_s2", "aetv2_paper"}


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_a_preset_restores_and_its_run_finished(name):
    run = pathlib.Path(presets.preset_directory(name))
    weights = run / presets.WEIGHTS
    assert file_digest(str(weights)) == presets.PRESETS[name].weights_sha256
    assert (run / (presets.WEIGHTS + CHECKSUM)).read_text().split()[0] == \
        presets.PRESETS[name].weights_sha256
    flags = json.loads((run / "flags.json").read_text())
    encoder, saved = restore_encoder(str(run))
    assert saved["backbone"] == "nin" and encoder.name == "nin"
    values = encoder.get_weights()
    assert values and all(np.isfinite(w).all() for w in values)
    with open(run / "train" / "log.csv") as f:
        rows = list(csv.DictReader(f))
    assert int(rows[-1]["step"]) == flags["train_steps"] == 8000
    assert np.isfinite(float(rows[-1]["loss"]))


@pytest.fixture
def preset_copy(tmp_path, monkeypatch):
    """The preset aetv1_cifar10's small files in a folder of its own, its weights absent."""
    preset = presets.PRESETS["aetv1_cifar10"]
    monkeypatch.setattr(presets, "PRESETS_ROOT", str(tmp_path))
    source = pathlib.Path(presets.REPOSITORY, "results", "scale", preset.run)
    shutil.copytree(source, tmp_path / preset.run,
                    ignore=shutil.ignore_patterns(presets.WEIGHTS + "*"))
    return preset


def test_absent_weights_are_restored_from_git_history(preset_copy):
    path = pathlib.Path(presets.restore_weights(preset_copy))
    assert file_digest(str(path)) == preset_copy.weights_sha256
    assert not list(path.parent.glob("*.tmp*"))


def test_a_file_that_is_not_the_preset_is_refused_and_left_alone(preset_copy):
    path = pathlib.Path(preset_copy.directory, presets.WEIGHTS)
    path.write_bytes(b"a user's own file")
    with pytest.raises(FileNotFoundError, match="is not preset 'aetv1_cifar10'.s encoder"):
        presets.restore_weights(preset_copy)
    assert path.read_bytes() == b"a user's own file"
    path.unlink()
    path.symlink_to(pathlib.Path(preset_copy.directory, "flags.json"))
    with pytest.raises(FileNotFoundError, match="symbolic link"):
        presets.restore_weights(preset_copy)
    assert path.is_symlink()


def test_weights_git_cannot_give_name_the_history_and_the_fix(preset_copy):
    missing = dataclasses.replace(preset_copy, weights_blob="0" * 40)
    with pytest.raises(FileNotFoundError,
                       match=r"git history of .*\(blob 0{40}\).*not `git clone --depth`"):
        presets.restore_weights(missing)
    wrong = dataclasses.replace(preset_copy, weights_sha256="0" * 64)
    with pytest.raises(FileNotFoundError, match="SHA-256 differs"):
        presets.restore_weights(wrong)
    assert not pathlib.Path(preset_copy.directory, presets.WEIGHTS).exists()
