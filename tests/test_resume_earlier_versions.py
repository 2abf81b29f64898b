"""Runs recorded by earlier versions resume with what they trained with: a flag whose default
changed since, and the loss flags of a config whose recipe changed since."""

import json

import pytest

from aetv2_tf.program.flags import (
    RECIPE_CHANGED_IN_0_2,
    adopt_earlier_defaults,
    adopt_earlier_recipe,
)


def test_a_run_of_an_earlier_version_resumes_with_the_joint_batch():
    """The default changed to per_branch: a run whose flags.json does not record the flag (it
    trained with the joint batch) continues with joint, unless the command line gives the flag;
    a run that records it keeps its own value."""
    values = {"siamese_batch_norm": "per_branch"}
    assert adopt_earlier_defaults({"siamese_batch_norm": "per_branch"}, values, ()) == []
    assert values["siamese_batch_norm"] == "per_branch"
    assert adopt_earlier_defaults({"stage": "pretext"}, values, ()) == \
        ["--siamese_batch_norm=joint"]
    assert values["siamese_batch_norm"] == "joint"
    values = {"siamese_batch_norm": "per_branch"}  # given on the command line: it wins
    assert adopt_earlier_defaults({"stage": "pretext"}, values, {"siamese_batch_norm"}) == []
    assert values["siamese_batch_norm"] == "per_branch"


NOW = {name: now for name, (_, now) in RECIPE_CHANGED_IN_0_2.items()}
EARLIER = {"stage": "pretext", "loss": "geodesic", "angle_power": 1, "loss_frame_scale": 16.0,
           "projection_weight": 0.0, "residual_frame": "loss"}
CONFIG = ["--flagfile=configs/cifar10_aetv2.cfg", "--model_dir=runs/cifar10_aetv2"]


def test_a_run_of_the_earlier_default_aetv2_resumes_with_its_loss():
    values = dict(NOW)
    made = adopt_earlier_recipe(EARLIER, values, CONFIG)
    assert made == ["--angle_power=1", "--loss_frame_scale=16", "--projection_weight=0",
                    "--residual_frame=loss"]
    assert values == {n: EARLIER[n] for n in RECIPE_CHANGED_IN_0_2}


def test_a_run_recorded_before_residual_frame_existed_counts_as_the_loss_frame():
    older = {k: v for k, v in EARLIER.items() if k != "residual_frame"}
    assert "--residual_frame=loss" in adopt_earlier_recipe(older, dict(NOW), CONFIG)


@pytest.mark.parametrize("saved, argv", [
    (dict(EARLIER, version="0.2.0"), CONFIG),           # recorded by this version: its own check
    (dict(EARLIER, projection_weight=1.0), CONFIG),      # another loss than the earlier default
    (dict(EARLIER, loss="mse"), CONFIG),                 # not an AETv2 run
    (EARLIER, [*CONFIG, "--projection_weight=10"]),      # the command line asks for the new loss
    (EARLIER, [*CONFIG, "--angle_power", "2"]),
], ids=["this_version", "other_loss", "aetv1", "explicit_flag", "explicit_flag_spaced"])
def test_anything_else_is_left_to_the_run_directory_check(saved, argv):
    values = dict(NOW)
    assert adopt_earlier_recipe(saved, values, argv) == []
    assert values == NOW


def test_the_earlier_values_are_those_of_the_earlier_config():
    """The table's 'before' side is configs/cifar10_aetv2_zoom16.cfg (the earlier default), its
    'since' side configs/cifar10_aetv2.cfg."""
    from aetv2_tf.method import recipes

    for name, (before, since) in RECIPE_CHANGED_IN_0_2.items():
        field = {"loss_frame_scale": "frame_scale"}.get(name, name)
        assert getattr(recipes.AETV2_ZOOM16.loss, field) == before
        assert getattr(recipes.AETV2.loss, field) == since


def test_the_program_reads_an_earlier_run_with_its_recipe(configured, tmp_path):
    """`config.from_flags` of the current config on a model_dir of a 0.1 run (its flags.json
    without a version): the run's loss, recorded as it trained."""
    (tmp_path / "flags.json").write_text(json.dumps(EARLIER))
    config = configured("--flagfile=configs/cifar10_aetv2.cfg", f"--model_dir={tmp_path}")
    assert (config.recipe.loss.frame_scale, config.recipe.loss.projection_weight) == (16.0, 0.0)
    assert config.values["loss_frame_scale"] == 16.0
    fresh = configured("--flagfile=configs/cifar10_aetv2.cfg", f"--model_dir={tmp_path}/new")
    assert fresh.recipe.loss == configured("--flagfile=configs/cifar10_aetv2.cfg",
                                           f"--model_dir={tmp_path}/x").recipe.loss
    assert fresh.recipe.loss.frame_scale == 4.0
