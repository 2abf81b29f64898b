"""The run's configuration is data (`aetv2_tf.program.config`): reading the flags opens no file
of a run and restores no preset; the `RunConfig` is wholly immutable; each group is filled by
name from the flags of the module that names it; the learning-rate drops are stored once, in
epochs, and give, step by step, the schedule their fractions of the run gave."""

from __future__ import annotations

import builtins
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import types

import keras
import numpy as np
import pytest

from aetv2_tf.files import presets
from aetv2_tf.method import optimizers
from aetv2_tf.method.recipe_parts import LossSpec, OptimizerSpec
from aetv2_tf.probes.classifier import step_lr_schedule
from aetv2_tf.program import probe_stage
from aetv2_tf.program.config import GROUP_TYPES, SPEC_FIELDS, RunConfig
from aetv2_tf.program.flags import FLAGS, MODULES


def _names(fields) -> set[str]:
    return {field.name for field in fields}


def test_each_group_is_the_flags_of_its_module():
    """A group's fields are exactly its module's flags; the recipe's flags are fields of its
    specs (four by another name: `SPEC_FIELDS`); the run's own fields and groups are all of
    `RunConfig` besides the record of values and the flags given."""
    own = set()
    for module in MODULES:
        names = {flag.name for flag in FLAGS.get_flags_for_module(module.__name__)}
        assert names, module.__name__
        if module.GROUP in GROUP_TYPES:
            assert names == _names(dataclasses.fields(GROUP_TYPES[module.GROUP])), module.GROUP
        elif module.GROUP == "recipe":
            spec = _names(dataclasses.fields(LossSpec)) | _names(dataclasses.fields(OptimizerSpec))
            assert {SPEC_FIELDS.get(name, name) for name in names} <= spec
        else:
            assert module.GROUP == "run"
            own |= names
    assert _names(dataclasses.fields(RunConfig)) == \
        own | set(GROUP_TYPES) | {"recipe", "values", "given"}
    data = {flag.name for flag in FLAGS.get_flags_for_module("aetv2_tf.program.flags.data")}
    assert {"val_examples", "test_examples", "dataset_name"} <= data


def _refused(*args, **kwargs):
    raise AssertionError(f"reading the flags touched the disk or ran a program: {args}")


def test_reading_the_flags_opens_no_file_of_a_run_and_restores_no_preset(configured, tmp_path,
                                                                         monkeypatch):
    """A model_dir whose budget.json and flags.json (a run of 0.1) would be refused, and a
    preset whose weights are absent: `from_flags` neither opens, stats nor restores anything
    (the checks that read them run where the run starts: tests/test_budget.py,
    tests/test_runs_of_version_0_1.py, `test_a_preset_is_restored_where_the_probe_starts`)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "flags.json").write_text(json.dumps({"stage": "pretext"}))
    (run / "budget.json").write_text(json.dumps({"train_seconds": 1.0, "train_steps": 3}))
    monkeypatch.setattr(presets, "PRESETS_ROOT", str(tmp_path / "presets"))
    with monkeypatch.context() as m:
        for module, name in ((builtins, "open"), (os, "stat"), (os, "lstat"), (os, "scandir"),
                             (os, "listdir"), (subprocess, "run"), (subprocess, "Popen")):
            m.setattr(module, name, _refused)
        pretext = configured("--train_seconds=60", f"--model_dir={run}")
        probe = configured("--stage=probe", "--pretrained=aetv1_cifar10",
                           f"--model_dir={tmp_path / 'probe'}")
    assert pretext.train.train_seconds == 60
    assert probe.probe.pretrained == str(tmp_path / "presets" / "aetv1_lr1e-4")
    assert not (tmp_path / "presets").exists()


def test_a_preset_is_restored_where_the_probe_starts(configured, tmp_path, monkeypatch):
    """``--pretrained=<preset>``: the record names its run directory (as every record did),
    and the probe's checks, before anything is written, restore its weights there."""
    preset = presets.PRESETS["aetv1_cifar10"]
    monkeypatch.setattr(presets, "PRESETS_ROOT", str(tmp_path))
    shutil.copytree(os.path.join(presets.REPOSITORY, "results", "scale", preset.run),
                    tmp_path / preset.run, ignore=shutil.ignore_patterns(presets.WEIGHTS + "*"))
    config = configured("--stage=probe", "--pretrained=aetv1_cifar10",
                        f"--model_dir={tmp_path / 'probe'}")
    assert config.flag_record()["pretrained"] == preset.directory
    weights = tmp_path / preset.run / presets.WEIGHTS
    assert not weights.exists()
    probe_stage.check_probe(config)
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == preset.weights_sha256
    assert not (tmp_path / "probe").exists()


def test_the_config_is_wholly_immutable(configured, tmp_path):
    """No field can be set and the record of values cannot be changed through the config; the
    dicts that flags.json and results.json need are new ones each time, lists as lists."""
    config = configured(f"--model_dir={tmp_path}", "--epochs=30", "--lr_schedule=step",
                        "--lr_drop_epochs=5,15")
    with pytest.raises(TypeError):
        config.values["seed"] = 1  # type: ignore[index]
    for group, field in (("stage", None), ("train", "seed"), ("recipe", "optimizer")):
        target = config if field is None else getattr(config, group)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(target, field or group, None)
    assert isinstance(config.values, types.MappingProxyType)
    assert all(isinstance(v, (str, int, float, bool, tuple, type(None)))
               for v in config.values.values())
    assert config.values["lr_drop_epochs"] == ("5", "15")
    record = config.flag_record()
    assert record["lr_drop_epochs"] == ["5", "15"]
    record["seed"] = 7
    assert config.values["seed"] == 0 and config.flag_record()["seed"] == 0
    assert json.loads(json.dumps(config.recorded({"policy": "float32"})))["lr_drop_epochs"] == \
        ["5", "15"]
    assert "--lr_drop_epochs=5,15\n" in config.flagfile_text()


def _rates(schedule, count: int) -> np.ndarray:
    return keras.ops.convert_to_numpy(schedule(np.arange(count)))


@pytest.mark.parametrize("epochs, drops, steps", [
    (200, (100, 150), 2000),  # the ImageNet pretraining config's drops, 10 steps an epoch
    (200, (100, 150), 777),  # --train_steps sizes the run: the drops scale with it
    (7, (1, 3, 6), 997),  # epochs of a fractional number of steps
    (35, (5, 15, 25), 35 * 391),  # RotNet's linear probe, CIFAR-10's batches of 128
    (3, (1, 2, 5), 3 * 37),  # a drop past the end never happens
])
def test_the_drops_in_epochs_give_the_schedule_of_their_fractions(configured, tmp_path, epochs,
                                                                  drops, steps):
    """The pretext schedule of ``--lr_drop_epochs`` (epochs turned into steps once, in
    `optimizers.Schedule`) equals at every step the one laid out on the fractions e / epochs of
    the run; the probe heads' per-epoch rate equals at every epoch the one of the whole epochs
    ``round(e / epochs * epochs)`` as fractions of the epochs."""
    flags = (f"--epochs={epochs}", "--lr_schedule=step", "--learning_rate=0.01",
             "--lr_drop_factor=0.1", "--lr_drop_epochs=" + ",".join(map(str, drops)))
    config = configured(f"--model_dir={tmp_path / 'pretext'}", *flags)
    assert (config.recipe.optimizer.lr_drop_epochs, config.recipe.optimizer.epochs) == \
        (drops, epochs)
    schedule, _ = config.recipe.optimizer.build(steps)
    fractions = optimizers.Schedule("step", 0.01, steps, drops=[e / epochs for e in drops],
                                    drop_factor=0.1)
    np.testing.assert_array_equal(_rates(schedule, steps + 1), _rates(fractions, steps + 1))
    assert len(np.unique(_rates(schedule, steps))) == 1 + sum(e < epochs for e in drops)

    probe = configured("--stage=probe", "--pretrained=none", "--probe=linear",
                       f"--model_dir={tmp_path / 'probe'}", *flags)
    per_epoch = probe_stage.probe_schedule(probe)
    whole = [int(round(e / epochs * epochs)) for e in drops]
    before = optimizers.Schedule("step", 0.01, epochs, drops=[b / epochs for b in whole],
                                 drop_factor=0.1)
    assert [per_epoch(e) for e in range(epochs + 1)] == \
        [float(r) for r in _rates(before, epochs + 1)]


def test_the_default_drops_of_the_probe_heads_are_their_rounded_epochs():
    """Without ``--lr_drop_epochs`` a head's rate drops at the whole epochs nearest 30%, 60%
    and 80% of the run, as when those epochs were laid out as fractions of it."""
    for epochs in range(1, 61):
        whole = [int(round(m * epochs)) for m in optimizers.STEP_DROPS]
        before = optimizers.Schedule("step", 0.1, epochs, drops=[b / epochs for b in whole])
        schedule = step_lr_schedule(epochs)
        assert schedule.boundaries == whole
        assert [schedule(e) for e in range(epochs + 1)] == \
            [float(r) for r in _rates(before, epochs + 1)], epochs
