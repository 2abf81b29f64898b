"""One program on every backend: what could differ silently between the TensorFlow and the JAX
programs, each checked on both (JAX in a child process with TensorFlow blocked, as on a machine
without it; TensorFlow in this process or as a CLI run)."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from aetv2_tf.method import geometry
from tests.cli import (
    BLOCK_TF,
    REPO,
    RUN_TRAIN,
    _env,
    read_scalars,
    run_jax,
    train_args,
)

#: A fit whose third batch of four is non-finite, under --on_nonfinite=stop and =skip, with
#: the coupled weight decay: one RESULT line each (the stop flag, the step, the skipped steps,
#: the updates, stopped or not) and one WEIGHTS line (the stop flag, the weights as JSON).
SKIP_STEPS = """
import json
import numpy as np, keras
from aetv2_tf.method import optimizers
from aetv2_tf.program.divergence import NonFiniteSteps
from aetv2_tf.program.run_control import RunControl
for stop in (True, False):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(
        1, kernel_initializer="ones", bias_initializer="ones")])
    opt = optimizers.build_optimizer("sgd", 0.01, weight_decay=0.5)
    model.compile(optimizer=opt, loss="mse")
    x, y = np.ones((32, 2), np.float32), np.ones((32, 1), np.float32)
    x[16:24] = np.nan  # batch 3 of 4 is non-finite
    control = RunControl(0, 4, 4, nonfinite=NonFiniteSteps(stop=stop))
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, callbacks=[control], verbose=0)
    value = lambda v: int(keras.ops.convert_to_numpy(v.value))
    print("RESULT", stop, control.step, value(opt.skipped_steps), value(opt.iterations),
          control.outcome().nonfinite_step)
    print("WEIGHTS", stop, json.dumps([w.numpy().tolist() for w in model.weights]))
"""


@pytest.fixture(scope="module")
def skipped_steps() -> dict[str, subprocess.CompletedProcess]:
    """`SKIP_STEPS` on each backend (one child process each): {backend: process}."""
    tf_run = subprocess.run([sys.executable, "-c", SKIP_STEPS], cwd=REPO, capture_output=True,
                            text=True, env=_env({"KERAS_BACKEND": "tensorflow"}), timeout=300)
    return {"jax": run_jax(SKIP_STEPS), "tensorflow": tf_run}


@pytest.mark.slow
@pytest.mark.parametrize("stop", [True, False])
def test_a_skipped_step_counts_the_same_on_both_backends(stop, skipped_steps):
    """The step is the batches consumed (a skipped batch counts), the optimizer's iterations the
    updates applied; --on_nonfinite=stop ends at the bad batch on JAX as on TensorFlow, and the
    weights are the same (the skip and the coupled weight decay, `stateless_apply` under
    JAX)."""
    expected = "RESULT True 3 1 2 True" if stop else "RESULT False 4 1 3 False"
    weights = {}
    for backend, proc in skipped_steps.items():
        assert proc.returncode == 0, (backend, proc.stderr[-3000:])
        results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
        assert [r for r in results if r.startswith(f"RESULT {stop} ")] == [expected], backend
        line = next(x for x in proc.stdout.splitlines() if x.startswith(f"WEIGHTS {stop} "))
        weights[backend] = json.loads(line.split(" ", 2)[2])
    want = _sgd_with_decay(updates=2 if stop else 3)
    for backend, (kernel, bias) in weights.items():
        np.testing.assert_allclose([*np.ravel(kernel), *bias], want, rtol=1e-5, err_msg=backend)


def _sgd_with_decay(updates: int, lr: float = 0.01, mu: float = 0.9, wd: float = 0.5):
    """float64 [w1, w2, b] of `SKIP_STEPS`'s Dense(1) (all ones) after ``updates`` steps of
    ``torch.optim.SGD(lr, mu, nesterov=True, weight_decay=wd)`` on its MSE: every input is
    (1, 1) and every target 1, so the data gradient of each is 2 (w1 + w2 + b - 1)."""
    w, buf = np.ones(3), None
    for _ in range(updates):
        d = 2 * (w.sum() - 1) + wd * w
        buf = d if buf is None else mu * buf + d
        w = w - lr * (d + mu * buf)
    return w


@pytest.fixture(scope="module")
def tf_runs(tmp_path_factory, finished_run):
    """A finished TensorFlow run (conftest.py's `finished_run`, read only) as "done", and as
    "cut" a copy of it as a run stopped before its end leaves it: its checkpoints, no final
    encoder (`encoder.weights.h5`), model file or export."""
    tmp = tmp_path_factory.mktemp("tf_runs")
    cut = pathlib.Path(shutil.copytree(finished_run[0], tmp / "cut", symlinks=True))
    for name in ("encoder.weights.h5", "aet_model.keras"):
        for path in (cut / name, cut / f"{name}.sha256"):
            path.unlink()
    shutil.rmtree(cut / "export")
    assert sorted(p.name for p in (cut / "checkpoints").glob("*.weights.h5")) == [
        "ckpt-3.weights.h5", "ckpt-6.weights.h5"]
    return {"done": finished_run[0], "cut": cut, "root": tmp}


def jax_cli(*args: str) -> subprocess.CompletedProcess:
    return run_jax(RUN_TRAIN.removeprefix(BLOCK_TF), *args)


@pytest.mark.slow
def test_jax_probes_a_finished_tensorflow_run(tf_runs, tmp_path, cifar10_dir):
    assert (tf_runs["done"] / "encoder.weights.h5").is_file()
    proc = jax_cli(*train_args(tmp_path / "knn", cifar10_dir, "--stage=probe", "--probe=knn",
                               f"--pretrained={tf_runs['done']}", "--test_examples=32"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Done (probe): probe=knn" in proc.stdout


@pytest.mark.slow
def test_jax_refuses_what_it_cannot_load_with_the_fix(tf_runs, tmp_path, cifar10_dir):
    cases = {
        "unfinished TensorFlow run": (
            [f"--pretrained={tf_runs['cut']}", "--stage=probe", "--probe=knn"],
            "without encoder.weights.h5"),
        "SavedModel": ([f"--pretrained={tf_runs['root'] / 'export'}", "--stage=probe"], None),
        "missing data_dir": (["--data_dir=/nonexistent/cifar"], "does not exist"),
        "mixed_float16 on a CPU": (["--mixed_precision=mixed_float16"], "needs a GPU"),
        "explicit --export without TensorFlow": (["--export=true"], "--export=true is not "
                                                 "available with KERAS_BACKEND=jax"),
    }
    saved_model = tf_runs["root"] / "export"  # a directory that looks like a SavedModel
    saved_model.mkdir(exist_ok=True)
    (saved_model / "saved_model.pb").write_bytes(b"")
    cases["SavedModel"] = (cases["SavedModel"][0], "is a TensorFlow SavedModel")
    for name, (flags, message) in cases.items():
        proc = jax_cli(*train_args(tmp_path / name.replace(" ", "_"), cifar10_dir, *flags,
                                   "--train_steps=2"))
        assert proc.returncode == 2, f"{name}: {proc.returncode}\n{proc.stderr[-3000:]}"
        assert message in proc.stderr and "Traceback" not in proc.stderr, f"{name}: {proc.stderr}"
        assert not (tmp_path / name.replace(" ", "_")).exists(), name  # nothing written


def test_geometry_accepts_tensorflow_variables():
    """`tf.Variable` inputs (a TensorFlow user's) work as before the keras.ops port, gradients
    included."""
    rng = np.random.default_rng(0)
    m = tf.Variable(rng.normal(size=(4, 3, 3)).astype(np.float32))
    with tf.GradientTape() as tape:
        angle = tf.reduce_sum(geometry.rotation_angle(geometry.project_to_so3(m)))
    gradient = tape.gradient(angle, m)
    constant = tf.constant(m.numpy())
    with tf.GradientTape() as tape:
        tape.watch(constant)
        want = tf.reduce_sum(geometry.rotation_angle(geometry.project_to_so3(constant)))
    np.testing.assert_array_equal(angle.numpy(), want.numpy())
    np.testing.assert_allclose(gradient.numpy(), tape.gradient(want, constant).numpy(),
                               rtol=1e-6, atol=1e-7)
    assert np.isfinite(gradient.numpy()).all() and np.abs(gradient.numpy()).max() > 0


def test_quarter_turns_are_np_rot90_of_the_normalised_images():
    """RotNet's batches on the device (`QuarterTurns`, augmentation off): rotation k of every
    image is `np.rot90(x, k)` of the normalised image, in the order of
    `pipelines.rotation_dataset` (all images in turn 0, then 1, 2, 3)."""
    from aetv2_tf.data.constants import CIFAR10_MEAN, CIFAR10_STD
    from aetv2_tf.data.preprocessing_layers import QuarterTurns

    images = np.random.default_rng(0).integers(0, 256, (3, 8, 8, 3), dtype=np.uint8)
    x, k = QuarterTurns(seed=0, augment=False)(images)
    normalised = (images / 255.0 - np.array(CIFAR10_MEAN)) / np.array(CIFAR10_STD)
    want = np.concatenate([np.rot90(normalised, turn, axes=(1, 2)) for turn in range(4)])
    np.testing.assert_allclose(np.asarray(x), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(k), np.repeat(np.arange(4), 3))
    augmented, _ = QuarterTurns(seed=0, augment=True)(images)
    assert augmented.shape == (12, 8, 8, 3) and not np.allclose(np.asarray(augmented), want)


def test_classifier_inputs_normalise_and_crop_flip_like_the_tf_pipeline():
    """The probes' device preprocessing (`ClassifierInputs`): in inference exactly the
    normalisation of `pipelines.normalize`; in training every image is a crop of the 4-px
    zero-padded image (offsets in -4..4), flipped or not, as `pipelines.pad_crop_flip`."""
    from aetv2_tf.data.constants import CIFAR10_MEAN, CIFAR10_STD
    from aetv2_tf.data.pipelines import normalize
    from aetv2_tf.data.preprocessing_layers import ClassifierInputs

    images = np.random.default_rng(1).integers(0, 256, (16, 32, 32, 3), dtype=np.uint8)
    layer = ClassifierInputs(seed=3, augment=True)
    np.testing.assert_allclose(np.asarray(layer(images, training=False)),
                               normalize(images).numpy(), rtol=0, atol=1e-6)
    got = np.asarray(layer(images, training=True))
    padded = np.pad(images / 255.0, ((0, 0), (4, 4), (4, 4), (0, 0)))
    candidates = [(dy, dx, flip) for dy in range(9) for dx in range(9) for flip in (0, 1)]
    found = []
    for b in range(len(images)):
        for dy, dx, flip in candidates:
            crop = padded[b, dy:dy + 32, dx:dx + 32]
            crop = crop[:, ::-1] if flip else crop
            want = (crop - np.array(CIFAR10_MEAN)) / np.array(CIFAR10_STD)
            if np.allclose(got[b], want, atol=1e-5):
                found.append((dy, dx, flip))
                break
        else:
            raise AssertionError(f"image {b} is no crop/flip of its padded image")
    assert len(set(found)) > 4  # the offsets and flips vary across the batch
    assert not np.allclose(np.asarray(layer(images, training=True)), got)  # a new draw a call
    np.testing.assert_allclose(np.asarray(ClassifierInputs(seed=3, augment=False)(
        images, training=True)), normalize(images).numpy(), rtol=0, atol=1e-6)


def test_labelled_batches_visit_every_image_once_per_epoch():
    """`LabelledBatches`: training epochs are seeded permutations (a new one per epoch, counted
    at its beginning, the same for the same seed), labels stay with their images, the last
    batch is short; evaluation keeps the order. With `full_batches` (several devices) every
    batch is full: training wraps around the epoch's order, evaluation pads with weight 0."""
    from aetv2_tf.data.stream import LabelledBatches, epoch_order

    images = np.arange(10, dtype=np.uint8).reshape(10, 1, 1, 1) * np.ones((1, 2, 2, 3), np.uint8)
    labels = np.arange(10) % 3

    def epoch(batches):
        parts = [batches[i] for i in range(len(batches))]
        return [np.concatenate(p) for p in zip(*parts, strict=True)]

    train = LabelledBatches(images, labels, 4, seed=5, shuffle=True)
    assert len(train) == 3 and len(train[2][0]) == 2
    before_fit = epoch(train)[0][:, 0, 0, 0]  # what Keras's symbolic build reads
    train.on_epoch_begin()  # fit epoch 0
    first, first_labels = epoch(train)
    np.testing.assert_array_equal(first[:, 0, 0, 0], epoch_order(5, 0, 10))
    np.testing.assert_array_equal(before_fit, first[:, 0, 0, 0])
    np.testing.assert_array_equal(first_labels, labels[first[:, 0, 0, 0]])
    train.on_epoch_end()
    train.on_epoch_begin()  # fit epoch 1
    second = epoch(train)[0][:, 0, 0, 0]
    assert sorted(second) == list(range(10)) and not np.array_equal(first[:, 0, 0, 0], second)
    evaluation = epoch(LabelledBatches(images, labels, 4, 5, shuffle=False))[0][:, 0, 0, 0]
    np.testing.assert_array_equal(evaluation, np.arange(10))

    full = LabelledBatches(images, labels, 4, seed=5, shuffle=True, full_batches=True)
    full.on_epoch_begin()
    wrapped = epoch(full)[0][:, 0, 0, 0]
    order = epoch_order(5, 0, 10)
    np.testing.assert_array_equal(wrapped, np.concatenate([order, order[:2]]))
    x, y, w = epoch(LabelledBatches(images, labels, 4, 5, shuffle=False, full_batches=True))
    np.testing.assert_array_equal(x[:, 0, 0, 0], [*range(10), 9, 9])
    np.testing.assert_array_equal(w, [1] * 10 + [0, 0])
    np.testing.assert_array_equal(y, labels[x[:, 0, 0, 0]])


@pytest.mark.slow
def test_rotnet_pretraining_under_jax_and_its_encoder_under_tensorflow(tmp_path, cifar10_dir):
    """RotNet runs under JAX (4 images x 4 turns a step), checkpoints, resumes exactly, and its
    encoder loads under TensorFlow for the probes."""
    from aetv2_tf.probes.frozen_encoder import load_frozen_encoder

    flags = ("--pretext=rotation", "--train_steps=4", "--checkpoint_every_steps=2")
    cut = jax_cli(*train_args(tmp_path / "cut", cifar10_dir, *flags, "--stop_after_steps=2"))
    assert cut.returncode == 0, cut.stderr[-3000:]
    full = jax_cli(*train_args(tmp_path / "full", cifar10_dir, *flags))
    resumed = jax_cli(*train_args(tmp_path / "cut", cifar10_dir, *flags))
    assert full.returncode == 0 and resumed.returncode == 0, full.stderr[-3000:]
    assert "aetv2_tf pretext: RotNet" in full.stdout and "rotation_accuracy=" in full.stdout
    digests = [line.split("trainable_digest=")[1].split(",")[0]
               for out in (full.stdout, resumed.stdout) for line in out.splitlines()
               if line.startswith("Done (")]
    assert len(digests) == 2 and digests[0] == digests[1]
    encoder = load_frozen_encoder(str(tmp_path / "full"), "nin", "block2", batch_norm="fused",
                           mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    assert encoder.method == "RotNet"
    assert encoder.checkpoint.endswith("encoder.weights.h5")


@pytest.mark.slow
def test_sigterm_under_jax_checkpoints_and_exits_143(tmp_path, cifar10_dir):
    """The signal contract of docs/reliability.md on the JAX adapter too: the final checkpoint
    at the step reached, exit 128 + 15, the last line says how to resume."""
    import signal
    import time

    model_dir = tmp_path / "run"
    log = open(tmp_path / "log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN_TRAIN, *train_args(model_dir, cifar10_dir, "--train_steps=500",
                                                      "--checkpoint_every_steps=2")],
        cwd=REPO, env=_env({"KERAS_BACKEND": "jax"}), stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    first = model_dir / "checkpoints" / "ckpt-2.weights.h5"
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.wait(120)
    log.close()
    out = (tmp_path / "log").read_text()
    assert proc.returncode == 143, out[-3000:]
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("Stopped by SIGTERM at step ") and "rerun the same command" in last
    reached = int(last.split("at step ")[1].split()[0])
    assert (model_dir / "checkpoints" / f"ckpt-{reached}.weights.h5").is_file()
    assert 2 <= reached < 500 and not (model_dir / "encoder.weights.h5").exists()


@pytest.mark.slow
def test_image_pairs_in_tensorboard_under_jax(tmp_path, cifar10_dir):
    """Where TensorFlow is importable, a JAX run draws the TensorBoard image pairs too (they
    were silently missing before), at step 0 and every --image_summary_every_steps."""
    run = subprocess.run(
        [sys.executable, "-m", "aetv2_tf.train",
         *train_args(tmp_path / "run", cifar10_dir, "--train_steps=4", "--summary_every_steps=2",
                     "--image_summary_every_steps=2", "--export=false")],
        cwd=REPO, capture_output=True, text=True, env=_env({"KERAS_BACKEND": "jax"}), timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "| jax OneDevice" in run.stdout
    tags = read_scalars(tmp_path / "run" / "train")
    assert sorted(tags["pairs"]) == [0, 2, 4] and sorted(tags["loss"]) == [2, 4]


@pytest.mark.slow
def test_folder_dataset_probes_under_jax_through_tf_data(tmp_path):
    """Under JAX where TensorFlow is importable, the probe stage reads an image-folder dataset
    with tf.data (AlexNet, 224 px, linear head with adaptive max pooling, and a KNN); the
    pretext stage refuses tensorflow-datasets with the fix (folders it reads itself:
    tests/test_jax_cli.py)."""
    from aetv2_tf.probes.results import read_results
    from tests.folders import write_image_folder

    data = tmp_path / "places"
    write_image_folder(data, {"train": 6, "val": 3})
    common = ("--flagfile=configs/places205_alexnet_linear.cfg", "--pretrained=none",
              "--feature=conv2", f"--data_dir={data}", "--batch_size=4", "--verbose=0")
    for name, extra in (("linear", ("--epochs=1", "--val_examples=2")),
                        ("knn", ("--probe=knn", "--knn_k=3"))):
        proc = subprocess.run([sys.executable, "-m", "aetv2_tf.train", *common, *extra,
                               f"--model_dir={tmp_path / name}"], cwd=REPO, capture_output=True,
                              text=True, env=_env({"KERAS_BACKEND": "jax"}), timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        r = read_results(tmp_path / name / "results.json")
        assert (r["backend"], r["dataset"], r["probe"], r["num_classes"]) == (
            "jax", "places205", name, 2)
        assert r["test_examples"] == 6 and 0 <= r["test_top1"] <= 100
    proc = subprocess.run([sys.executable, "-m", "aetv2_tf.train", *train_args(
        tmp_path / "pretext", data, "--dataset=imagenet2012", "--backbone=alexnet")], cwd=REPO,
        capture_output=True, text=True, env=_env({"KERAS_BACKEND": "jax"}), timeout=300)
    assert proc.returncode == 2 and "--dataset=imagenet2012 is not available" in proc.stderr
    assert "or --dataset=folder" in proc.stderr
