"""Runs recorded by earlier versions resume with what they trained with: a flag whose default
changed since, and the loss flags of a config whose recipe changed since."""

import pytest

from aetv2_tf.program.flags import (
    FLAGS,
    RECIPE_CHANGED_IN_0_2,
    adopt_earlier_defaults,
    adopt_earlier_recipe,
)


def test_a_run_of_an_earlier_version_resumes_with_the_joint_batch(monkeypatch):
    """The default changed to per_branch: a run whose flags.json does not record the flag (it
    trained with the joint batch) continues with joint, unless the command line gives the flag;
    a run that records it keeps its own value."""
    flag = FLAGS["siamese_batch_norm"]
    monkeypatch.setattr(flag, "value", "per_branch")
    monkeypatch.setattr(flag, "present", 0)
    assert adopt_earlier_defaults({"stage": "pretext", "siamese_batch_norm": "per_branch"}) == []
    assert flag.value == "per_branch"
    assert adopt_earlier_defaults({"stage": "pretext"}) == ["--siamese_batch_norm=joint"]
    assert flag.value == "joint"
    flag.value, flag.present = "per_branch", 1  # given on the command line: it wins
    assert adopt_earlier_defaults({"stage": "pretext"}) == []
    assert flag.value == "per_branch"


@pytest.fixture
def current_recipe_flags(monkeypatch):
    """The loss flags as configs/cifar10_aetv2.cfg sets them now."""
    for name, (_, now) in RECIPE_CHANGED_IN_0_2.items():
        monkeypatch.setattr(FLAGS[name], "value", now)
    return {name: FLAGS[name] for name in RECIPE_CHANGED_IN_0_2}


EARLIER = {"stage": "pretext", "loss": "geodesic", "angle_power": 1, "loss_frame_scale": 16.0,
           "projection_weight": 0.0, "residual_frame": "loss"}
CONFIG = ["--flagfile=configs/cifar10_aetv2.cfg", "--model_dir=runs/cifar10_aetv2"]


def test_a_run_of_the_earlier_default_aetv2_resumes_with_its_loss(current_recipe_flags):
    made = adopt_earlier_recipe(EARLIER, CONFIG)
    assert made == ["--angle_power=1", "--loss_frame_scale=16", "--projection_weight=0",
                    "--residual_frame=loss"]
    assert {n: f.value for n, f in current_recipe_flags.items()} == {
        n: EARLIER[n] for n in RECIPE_CHANGED_IN_0_2}


def test_a_run_recorded_before_residual_frame_existed_counts_as_the_loss_frame(
        current_recipe_flags):
    older = {k: v for k, v in EARLIER.items() if k != "residual_frame"}
    assert "--residual_frame=loss" in adopt_earlier_recipe(older, CONFIG)


@pytest.mark.parametrize("saved, argv", [
    (dict(EARLIER, version="0.2.0"), CONFIG),           # recorded by this version: its own check
    (dict(EARLIER, projection_weight=1.0), CONFIG),      # another loss than the earlier default
    (dict(EARLIER, loss="mse"), CONFIG),                 # not an AETv2 run
    (EARLIER, [*CONFIG, "--projection_weight=10"]),      # the command line asks for the new loss
    (EARLIER, [*CONFIG, "--angle_power", "2"]),
], ids=["this_version", "other_loss", "aetv1", "explicit_flag", "explicit_flag_spaced"])
def test_anything_else_is_left_to_the_run_directory_check(current_recipe_flags, saved, argv):
    assert adopt_earlier_recipe(saved, argv) == []
    assert all(f.value == RECIPE_CHANGED_IN_0_2[n][1] for n, f in current_recipe_flags.items())


def test_the_earlier_values_are_those_of_the_earlier_config():
    """The table's 'before' side is configs/cifar10_aetv2_zoom16.cfg (the earlier default), its
    'since' side configs/cifar10_aetv2.cfg."""
    from aetv2_tf import recipes

    for name, (before, since) in RECIPE_CHANGED_IN_0_2.items():
        field = {"loss_frame_scale": "frame_scale"}.get(name, name)
        assert getattr(recipes.AETV2_ZOOM16, field) == before
        assert getattr(recipes.AETV2, field) == since
