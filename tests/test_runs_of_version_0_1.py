"""A --model_dir holding a pretraining run of version 0.1 (its flags.json records no version;
the defaults of --siamese_batch_norm and of the AETv2 loss differ from this version's) is
refused before anything is written, naming the version that resumes it; --overwrite starts
afresh there. The presets of results/scale, runs of 0.1 too, are read as encoders all the same
(tests/test_results.py, tests/test_any_backbone.py)."""

import json
import pathlib
import subprocess

import pytest

from aetv2_tf.errors import UsageError
from aetv2_tf.method import recipes
from aetv2_tf.program.config import RESUMES_VERSION_0_1, check_machine

REPO = pathlib.Path(__file__).resolve().parents[1]
#: The flags.json of a run of version 0.1 trained with its configs/cifar10_aetv2.cfg.
VERSION_0_1 = {"stage": "pretext", "loss": "geodesic", "angle_power": 1,
               "loss_frame_scale": 16.0, "projection_weight": 0.0, "residual_frame": "loss"}


def test_a_run_of_version_0_1_is_refused_naming_the_version_that_resumes_it(configured,
                                                                           tmp_path):
    record = tmp_path / "flags.json"
    record.write_text(json.dumps(VERSION_0_1))
    config = configured("--flagfile=configs/cifar10_aetv2.cfg", f"--model_dir={tmp_path}")
    assert config.recipe == recipes.AETV2  # the flags alone: the folder is not read with them
    with pytest.raises(UsageError, match=rf"--model_dir={tmp_path} holds a run of aetv2_tf 0\.1 "
                                         rf".*records no version.*git checkout "
                                         rf"{RESUMES_VERSION_0_1}.*--overwrite"):
        check_machine(config, 1, "tensorflow", accelerator=False)
    assert [p.name for p in tmp_path.iterdir()] == ["flags.json"]
    assert json.loads(record.read_text()) == VERSION_0_1
    check_machine(configured("--flagfile=configs/cifar10_aetv2.cfg", f"--model_dir={tmp_path}",
                             "--overwrite"), 1, "tensorflow", accelerator=False)
    probe = configured("--stage=probe", "--pretrained=none", f"--model_dir={tmp_path}")
    check_machine(probe, 1, "tensorflow", accelerator=False)  # a probe writes a run of its own


def test_a_run_of_this_version_and_an_unreadable_record_are_left_to_the_run_directory(
        configured, tmp_path):
    """A record with a version is compared flag by flag where the model_dir is prepared
    (`rundir.prepare`), which also reports a record it cannot read."""
    record = tmp_path / "flags.json"
    config = configured("--flagfile=configs/cifar10_aetv2.cfg", f"--model_dir={tmp_path}")
    for text in (json.dumps(dict(VERSION_0_1, version="0.2.0")), "{not json", "[1, 2]"):
        record.write_text(text)
        check_machine(config, 1, "tensorflow", accelerator=False)


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          check=True).stdout


def test_the_named_commit_is_the_last_of_version_0_1():
    """The message's commit records version 0.1.0, the next one on the main line (first
    parents) to HEAD another."""
    assert 'version = "0.1.0"' in _git("show", f"{RESUMES_VERSION_0_1}:pyproject.toml")
    after = _git("rev-list", "--first-parent", "--reverse", f"{RESUMES_VERSION_0_1}..HEAD")
    assert 'version = "0.1.0"' not in _git("show", f"{after.split()[0]}:pyproject.toml")


def test_the_encoder_of_a_run_with_tf_checkpoints_only_is_refused_naming_the_version(tmp_path):
    """`restore_encoder` (the export's and the probes' reader) refuses a run of 0.1 whose
    checkpoints are all `tf.train.Checkpoint` files, naming the commit that resumes it."""
    from aetv2_tf.files.savedmodel import TF_CHECKPOINTS_RESUMED_BY, restore_encoder

    (tmp_path / "flags.json").write_text(json.dumps({**VERSION_0_1, "backbone": "nin",
                                                     "dataset": "cifar10"}))
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-4"\n')
    with pytest.raises(ValueError, match=rf"tf\.train\.Checkpoint checkpoints of aetv2_tf 0\.1.*"
                                         rf"git checkout {TF_CHECKPOINTS_RESUMED_BY}"):
        restore_encoder(str(tmp_path))
