"""The model the device measurement times (`benchmarks.device_step` and its breakdown part,
`benchmarks.step_breakdown`): the default AETv2 of `FLAGFILE`, built as the training program
builds it."""

from __future__ import annotations

import dataclasses
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
FLAGFILE = "configs/cifar10_aetv2.cfg"


def run_config(batch: int, spe: int):
    """The `RunConfig` of the default AETv2 (`FLAGFILE`) at ``batch``, read as
    ``python -m aetv2_tf.train`` reads its flags."""
    from aetv2_tf.program.config import from_flags
    from aetv2_tf.program.flags import FLAGS

    argv = ["device_step", f"--flagfile={REPO / FLAGFILE}", f"--batch_size={batch}",
            f"--steps_per_execution={spe}", "--model_dir=/tmp/device_step_run",
            "--train_steps=100000", "--mixed_precision=mixed_bfloat16"]
    FLAGS(argv)
    return from_flags(FLAGS, argv)


def build(config, one_pass: bool, projection: str, policy: str = "mixed_bfloat16"):
    """``(encoder, model)``: `pretext_stage.build_model` of ``config`` (the same initial weights
    every call) with per-branch BatchNorm computed ``one_pass`` and P projected by
    ``projection``, under the dtype ``policy``."""
    import keras

    from aetv2_tf.data.constants import CIFAR10_MEAN, CIFAR10_STD
    from aetv2_tf.program import pretext_stage

    keras.mixed_precision.set_global_policy(policy)
    config = dataclasses.replace(config, recipe=config.recipe.replace(projection=projection))
    encoder, model, _, _ = pretext_stage.build_model(
        config, config.train.train_steps, inputs="images", mean=CIFAR10_MEAN, std=CIFAR10_STD,
        augment=config.data.augment, one_pass=one_pass)
    return encoder, model
