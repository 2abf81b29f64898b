"""The pretext training program end to end: `python -m aetv2_tf.train` on real CIFAR-10 slices."""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.cli import REPO, finished_run_args, read_scalars, run_module, train, train_args

# The fast tier (`-m "not slow"`) leaves this file out: the training program's runs, in a
# child or in-process.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(finished_run):
    """One 6-step AETv2 run (conftest.py's `finished_run`, shared by other files: read only):
    checkpoints every 3 steps, scalars every 2, images every 3; its length given only by
    --train_steps after quickstart.cfg's --train_seconds=150. (model_dir, its stdout)."""
    return finished_run


def test_run_finishes_with_a_finite_loss_and_a_summary_line(run_dir):
    _, stdout = run_dir
    line = [x for x in stdout.splitlines() if x.startswith("Done (pretext)")]
    assert line, stdout
    loss = float(re.search(r"\bloss=([-+0-9.e]+|nan|inf)", line[0]).group(1))
    assert math.isfinite(loss) and loss > 0
    assert "steps=6" in line[0]


def test_checkpoints_flags_and_exports_are_written(run_dir):
    model_dir, _ = run_dir
    ckpts = sorted(p.name for p in (model_dir / "checkpoints").glob("*.weights.h5"))
    assert ckpts == ["ckpt-3.weights.h5", "ckpt-6.weights.h5"]  # the format of every backend
    text = (model_dir / "flags.cfg").read_text()
    assert "--loss=geodesic" in text and "--train_steps=6" in text
    flags = json.loads((model_dir / "flags.json").read_text())
    assert flags["batch_size"] == 16
    # --train_steps given after a flagfile that sizes the run in seconds wins (and is recorded)
    assert (flags["train_steps"], flags["train_seconds"]) == (6, 0.0)
    assert (model_dir / "aet_model.keras").is_file()
    assert (model_dir / "export" / "encoder" / "saved_model.pb").is_file()


def test_tensorboard_tags(run_dir):
    """The scalars the console shows, and only those: the loss (the recipe's, theta^2 in the 4x
    frame + 10 x the unit-frame residual: the sum of its terms), its terms, the angle in the
    loss's frame, the quarter-turn accuracy, the weight decay apart; no term of weight 0 (the
    recipe adds no MSE)."""
    model_dir, _ = run_dir
    scalars = read_scalars(model_dir / "train")
    shown = ("loss", "angle_term", "residual_term", "angle_deg", "rotation_accuracy",
             "l2_penalty", "learning_rate", "pairs_per_sec")
    assert sorted(scalars) == sorted([*shown, "pairs"])
    for tag in shown:
        assert sorted(scalars[tag]) == [2, 4, 6], tag
        assert all(math.isfinite(v) for v in scalars[tag].values()), tag
    assert sorted(scalars["pairs"]) == [0, 3, 6]  # image summaries
    assert all(0 <= v <= 180 for v in scalars["angle_deg"].values())
    for step in (2, 4, 6):
        assert scalars["loss"][step] == pytest.approx(
            scalars["angle_term"][step] + scalars["residual_term"][step], rel=1e-4)


def test_saved_model_loads_without_this_package(run_dir):
    """The export works in a fresh process that never imports aetv2_tf, and does with other
    input exactly what the export's docstring (and the README) says: a tensor of another dtype
    or size is refused; a NumPy array of another dtype is converted to uint8 by TensorFlow
    before the signature runs, as ``x.astype(np.uint8)`` would ([0, 1] floats: black images)."""
    model_dir, _ = run_dir
    script = textwrap.dedent(f"""
        import sys, numpy as np, tensorflow as tf
        m = tf.saved_model.load({str(model_dir / "export" / "encoder")!r})
        f = m.signatures["serving_default"]
        pixels = np.random.RandomState(0).randint(0, 255, (2, 32, 32, 3))
        out = f(images=tf.constant(pixels, tf.uint8))
        assert "aetv2_tf" not in sys.modules
        for bad in (tf.constant(pixels / 255, tf.float32), tf.constant(pixels[:, :16, :16],
                                                                       tf.uint8)):
            try:
                f(images=bad)
                raise AssertionError(f"{{bad.dtype}} {{bad.shape}} accepted")
            except (tf.errors.InvalidArgumentError, TypeError, ValueError) as e:
                assert "uint8" in str(e) or "32" in str(e), e
        floats = (pixels / 255).astype(np.float32)  # [0, 1]: cast, as astype would
        np.testing.assert_array_equal(f(images=floats)["block2"],
                                      f(images=floats.astype(np.uint8))["block2"])
        assert not np.allclose(f(images=floats)["block2"], out["block2"])
        print(sorted((k, tuple(v.shape), v.dtype.name) for k, v in out.items()))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd="/", timeout=300, check=True)
    assert proc.stdout.strip() == str([
        ("block1", (2, 16, 16, 96), "float32"), ("block2", (2, 8, 8, 192), "float32"),
        ("block3", (2, 8, 8, 192), "float32"), ("block4", (2, 8, 8, 192), "float32")])


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_the_keras_file_reloads_with_only_import_aetv2_tf(run_dir, backend):
    """`import aetv2_tf` alone (no other module of the package, in
    either order with Keras) registers every class the CLI's `.keras` file names, on both
    backends, in a fresh process (aetv2_tf/registry.py); under JAX with TensorFlow blocked."""
    path = str(run_dir[0] / "aet_model.keras")
    script = textwrap.dedent(f"""
        import os, sys
        if os.environ["KERAS_BACKEND"] == "jax":
            sys.modules["tensorflow"] = None
        import keras, aetv2_tf
        model = keras.saving.load_model({path!r})
        print(model.name, model.optimizer.__class__.__name__, model.count_params())
    """)
    env = {**os.environ, "KERAS_BACKEND": backend}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd="/", timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    name, optimizer, params = proc.stdout.split()
    assert (name, optimizer) == ("aet", "SkipNonFinite") and int(params) > 1_000_000


def test_a_finished_run_rerun_says_complete_and_does_nothing_else(run_dir, cifar10_dir, program,
                                                                  capsys, tmp_path):
    """The command of a finished run, again (in-process, on a copy of the run): "Complete",
    where its outputs are, exit 0; nothing trained (no resume, no new checkpoint or
    TensorBoard file), exported or scored (the export's files untouched)."""
    model_dir = pathlib.Path(shutil.copytree(run_dir[0], tmp_path / "run", symlinks=True))
    before = {p: p.stat().st_mtime_ns for p in model_dir.rglob("*") if p.is_file()
              and p.name not in ("flags.cfg", ".lock")}
    assert program(*finished_run_args(model_dir, cifar10_dir)) == 0
    out = capsys.readouterr().out
    assert f"Complete: the run in {model_dir} finished all its 6 steps before; nothing was " \
        "trained, exported or scored now." in out, out
    assert f"its SavedModel: {model_dir}/export/encoder" in out
    assert "Done (" not in out and "Resumed" not in out and "Quick KNN" not in out
    after = {p: p.stat().st_mtime_ns for p in model_dir.rglob("*") if p.is_file()
             and p.name not in ("flags.cfg", ".lock")}
    assert after == before


def test_warnings_name_flags_and_a_stopped_run_is_not_done(tmp_path, cifar10_dir, program,
                                                           capfd, caplog):
    """A warm-up longer than half the run warns once, the library's words with the flags that
    set what it names (not Python code); --stop_after_steps ends with "Stopped ... at step 2
    of 4" and the line that says to rerun, never "Done"; the progress bar shows the loss and
    its terms first (in-process)."""
    args = train_args(tmp_path / "run", cifar10_dir, "--train_steps=4", "--warmup_steps=3",
                      "--stop_after_steps=2", "--export=false", "--verbose=1")
    assert program(*args) == 0
    out, err = capfd.readouterr()
    err += caplog.text  # absl's log records
    assert err.count("warmup_steps=3 in a run of 4 steps: the learning rate peaks at ") == 1
    assert "shorten the warm-up (to 0, say), or train for at least 6 steps (flags: " \
        "--warmup_steps, --train_steps)" in err
    assert "Warning" not in err and "recipe" not in err, err
    assert "Stopped (pretext) at step 2 of 4: steps=2, start_step=0," in out and \
        "rerun the same command to continue." in out and "Done (" not in out, out
    bar = out.replace("\r", "\n").split("Stopped (pretext)")[0].strip().splitlines()[-1]
    assert [name for name in ("loss:", "angle_term:", "residual_term:", "angle_deg:",
                              "rotation_accuracy:", "l2_penalty:") if name in bar] == [
        "loss:", "angle_term:", "residual_term:", "angle_deg:", "rotation_accuracy:",
        "l2_penalty:"] and bar.index("loss:") < bar.index("angle_term:") < \
        bar.index("residual_term:") < bar.index("angle_deg:") < bar.index("l2_penalty:"), bar


def test_export_command_reexports_from_the_newest_checkpoint(run_dir, tmp_path):
    out = tmp_path / "encoder"
    proc = run_module("aetv2_tf.export", f"--model_dir={run_dir[0]}", f"--output={out}")
    assert (out / "saved_model.pb").is_file(), proc.stdout
    # as quiet as train: no TensorFlow start-up lines (oneDNN, absl::InitializeLog), no INFO
    assert proc.stdout == f"Exported the encoder to {out}\n" and proc.stderr == "", proc.stderr


MIRRORED_LOSS = textwrap.dedent("""
    import numpy as np, keras, tensorflow as tf
    from aetv2_tf.program.distribute import configure_cpu_devices, get_strategy
    configure_cpu_devices(2)
    from aetv2_tf.data import load_cifar10, pretext_dataset
    from aetv2_tf.method.losses import GeodesicLoss
    from aetv2_tf.models import build_aet_model, build_backbone
    images, _ = load_cifar10({data!r}, "test")
    (x, tx), params = next(iter(pretext_dataset(images[:32], 32, seed=3, training=False)))
    results = []
    for name in ("default", "mirrored"):
        strategy = get_strategy(name)
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = build_aet_model(build_backbone("nin", (32, 32, 3)))
            model.compile(keras.optimizers.SGD(0.1), GeodesicLoss(), jit_compile=False)
        loss = model.evaluate((x, tx), params, batch_size=32, verbose=0)
        results.append((strategy.num_replicas_in_sync, loss))
    print(results)
""")


def test_mirrored_on_two_cpu_devices_gives_the_default_loss(cifar10_dir):
    proc = subprocess.run([sys.executable, "-c", MIRRORED_LOSS.format(data=str(cifar10_dir))],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (n1, default), (n2, mirrored) = eval(proc.stdout.strip().splitlines()[-1])
    assert (n1, n2) == (1, 2)
    assert mirrored == pytest.approx(default, rel=1e-5)


def test_mirrored_training_through_the_cli(tmp_path, cifar10_dir):
    proc = train(tmp_path, cifar10_dir, "--train_steps=2", "--strategy=mirrored",
                 "--cpu_devices=2", "--export=false")
    assert "steps=2" in proc.stdout
    assert "MirroredStrategy x2" in proc.stdout
    assert "| oneDNN on |" in proc.stdout  # the CPU kernels, on every CPU (aetv2_tf asks)
