"""The training program under Keras on JAX, with TensorFlow blocked (as on a machine without it).

Child processes run `python -m aetv2_tf.train` with `KERAS_BACKEND=jax` and
`sys.modules["tensorflow"] = None` (any TensorFlow import fails): a 6-step pretext run on 256
CIFAR-10 images, the same run cut at step 5 with --steps_per_execution=3 and resumed, the same
run on two CPU devices (`keras.distribution.DataParallel`, XLA's host-platform device count), a
mixed_bfloat16 run with an MSE warm-up (`--mse_decay_steps`), the KNN, 1-FC and conv probes of
the run, the supervised stage, and, in one child, the block-2 features of the encoder and an
AlexNet AET model loaded from this process's weights. This process (TensorFlow) then loads the
run's encoder into the fused-BN NIN (`--pretrained=<jax run>`, `aetv2_tf.export`) and compares
the features, and the AlexNet's outputs with its own.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from aetv2_tf import __version__
from tests.cli import BLOCK_TF, REPO, RUN_TRAIN, _env, finish_jax, start_jax, train_args

# The fast tier (`-m "not slow"`) leaves this file out: every test reads the Keras-on-JAX
# training children (or starts one).
pytestmark = pytest.mark.slow

#: The block-2 features of the JAX run's encoder on 8 test images (model_dir, data_dir, out),
#: then an AlexNet AET model (Keras BN) with this process's weights: its features (inference)
#: and decoded parameters (training-mode batch statistics) (weights, inputs, out).
FEATURES_AND_ALEXNET = BLOCK_TF + """
import json, pathlib, sys
import numpy as np
from aetv2_tf.data.constants import CIFAR10_MEAN, CIFAR10_STD
from aetv2_tf.data.sources import load_cifar10
from aetv2_tf.models import build_aet_model, build_alexnet
from aetv2_tf.program.keras_checkpoints import load_encoder_weights
model_dir, data_dir, out, weights, inputs, alexnet_out = sys.argv[1:]
saved = json.loads((pathlib.Path(model_dir) / "flags.json").read_text())
encoder = load_encoder_weights(model_dir, saved, "keras")
images = load_cifar10(data_dir, "test")[0][:8]
x = ((images / 255.0 - np.array(CIFAR10_MEAN)) / np.array(CIFAR10_STD)).astype("float32")
np.save(out, np.asarray(encoder(x, training=False)["block2"]))

encoder = build_alexnet((64, 64, 3), batch_norm="keras")
model = build_aet_model(encoder, feature="fc7")
model.load_weights(weights)
x = np.load(inputs)
features = {k: np.asarray(v) for k, v in encoder(x, training=False).items()}
np.savez(alexnet_out, params=np.asarray(model([x, x[::-1]], training=True)), **features)
"""


def done_line(out: str) -> str:
    """The stage's summary line: "Done (stage): ..." or, for a run stopped before its end,
    "Stopped (stage) at step S of M: ..."."""
    lines = [x for x in out.splitlines() if x.startswith(("Done (", "Stopped ("))]
    assert lines, out[-3000:]
    return lines[-1]


def head_args(model_dir, data_dir, config: str, *args: str) -> list[str]:
    """A 2-epoch classifier-head run of `configs/<config>.cfg` on a small CIFAR-10 slice."""
    return [f"--flagfile=configs/{config}.cfg", f"--model_dir={model_dir}",
            f"--data_dir={data_dir}", "--train_examples=256", "--val_examples=64",
            "--test_examples=64", "--epochs=2", "--batch_size=32", "--verbose=0",
            "--mixed_precision=none", *args]


TWO_CPUS = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}


def alexnet_model(tmp) -> tuple:
    """A TensorFlow AlexNet AET model's weights (pool5 1x1: a small fc6) and 4 random inputs,
    saved in `tmp` for the JAX child: (weights file, inputs file)."""
    from aetv2_tf.models import build_aet_model, build_alexnet

    model = build_aet_model(build_alexnet((64, 64, 3), batch_norm="keras"), feature="fc7")
    x = np.random.default_rng(0).normal(size=(4, 64, 64, 3)).astype("float32")
    np.save(tmp / "x.npy", x)
    model.save_weights(tmp / "aet.weights.h5")
    return tmp / "aet.weights.h5", tmp / "x.npy"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cifar10_dir):
    """The JAX children, two at a time (2 cores), ordered so that a child finds what an earlier
    one compiled in the session's XLA compilation cache (conftest.py): full run || supervised,
    a run cut at step 5 with --steps_per_execution=3 || conv probe, its resume || KNN, bfloat16
    || a 1-FC probe on two devices whose splits are no multiple of the batch, two devices || the
    features of the full run's encoder and the AlexNet outputs (`alexnet_model`'s weights)."""
    tmp = tmp_path_factory.mktemp("jax")
    full, spe = tmp / "full", tmp / "spe"
    weights, inputs = alexnet_model(tmp)
    common = ("--train_steps=6", "--checkpoint_every_steps=3", "--summary_every_steps=2",
              "--mixed_precision=none")
    probe_args = train_args(tmp / "knn", cifar10_dir, "--stage=probe", "--probe=knn",
                            f"--pretrained={full}", "--test_examples=64", "--mixed_precision=none")
    rounds = [
        {"full": (RUN_TRAIN, *train_args(full, cifar10_dir, *common)),
         "supervised": (RUN_TRAIN, *head_args(tmp / "supervised", cifar10_dir,
                                              "cifar10_supervised"))},
        {"spe1": (RUN_TRAIN, *train_args(spe, cifar10_dir, *common, "--steps_per_execution=3",
                                         "--stop_after_steps=5")),
         "conv": (RUN_TRAIN, *head_args(tmp / "conv", cifar10_dir, "cifar10_probe_conv",
                                        f"--pretrained={full}"))},
        {"spe2": (RUN_TRAIN, *train_args(spe, cifar10_dir, *common, "--steps_per_execution=3")),
         "knn": (RUN_TRAIN, *probe_args)},
        {"bf16": (RUN_TRAIN, *train_args(tmp / "bf16", cifar10_dir, *common,
                                         "--mixed_precision=mixed_bfloat16", "--mse_weight=1",
                                         "--mse_decay_steps=4")),
         "fc1": (RUN_TRAIN, *head_args(tmp / "fc1", cifar10_dir, "cifar10_probe_fc1",
                                       f"--pretrained={full}", "--batch_size=40"), TWO_CPUS)},
        {"two": (RUN_TRAIN, *train_args(tmp / "two", cifar10_dir, *common), TWO_CPUS),
         "features": (FEATURES_AND_ALEXNET, full, cifar10_dir, tmp / "jax_block2.npy", weights,
                      inputs, tmp / "alexnet.npz")},
    ]
    out = {}
    for children in rounds:
        procs = {}
        for name, (code, *args) in children.items():
            env = args.pop() if isinstance(args[-1], dict) else None
            procs[name] = start_jax(code, *args, log=tmp / f"{name}.log", env=env)
        out.update({name: finish_jax(proc) for name, proc in procs.items()})
    return tmp, out


def test_import_and_helpfull_without_tensorflow():
    code = BLOCK_TF + ("import aetv2_tf.train, aetv2_tf.program.keras_native_backend, "
                       "aetv2_tf.program.probe_stage, aetv2_tf.export, "
                       "aetv2_tf.probes.frozen_encoder; print('imported')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, env=_env({"KERAS_BACKEND": "jax"}), timeout=120)
    assert proc.returncode == 0 and "imported" in proc.stdout, proc.stderr[-3000:]
    helpfull = subprocess.run([sys.executable, "-c", RUN_TRAIN, "--helpfull"], cwd=REPO,
                              capture_output=True, text=True,
                              env=_env({"KERAS_BACKEND": "jax"}), timeout=120)
    # absl's --helpfull exits with 1 after printing the flags.
    assert "--projection_weight" in helpfull.stdout and "Traceback" not in helpfull.stderr, \
        helpfull.stderr[-3000:]


def test_tensorflow_only_flags_are_refused(tmp_path, cifar10_dir):
    proc = subprocess.run([sys.executable, "-c", RUN_TRAIN,
                           *train_args(tmp_path / "m", cifar10_dir, "--strategy=mirrored")],
                          cwd=REPO, capture_output=True, text=True,
                          env=_env({"KERAS_BACKEND": "jax"}), timeout=120)
    assert proc.returncode == 2
    assert "--strategy=mirrored is not available with KERAS_BACKEND=jax" in proc.stderr
    # A TensorFlow run's model_dir (no "backend" recorded) that has trained (a checkpoint; a
    # start that trained nothing would be set aside and started afresh:
    # test_untrusted_files_are_left_alone.py).
    (tmp_path / "tf_run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "tf_run" / "flags.json").write_text(json.dumps({"stage": "pretext",
                                                               "version": __version__}))
    (tmp_path / "tf_run" / "checkpoints" / "ckpt-4.weights.h5").write_bytes(b"weights")
    proc = subprocess.run([sys.executable, "-c", RUN_TRAIN,
                           *train_args(tmp_path / "tf_run", cifar10_dir, "--train_steps=6")],
                          cwd=REPO, capture_output=True, text=True,
                          env=_env({"KERAS_BACKEND": "jax"}), timeout=120)
    assert proc.returncode == 2 and "holds a run of the tensorflow backend" in proc.stderr


def test_pretext_run_writes_checkpoints_logs_and_encoder(runs):
    tmp, out = runs
    line = done_line(out["full"])
    assert line.startswith("Done (pretext): steps=6, start_step=0,") and "pairs_per_sec=" in line
    assert np.isfinite(float(re.search(r"\bloss=([-+0-9.e]+|nan|inf)", line).group(1)))
    assert re.search(r"^aetv2_tf pretext: AETv2 .* \| jax OneDevice x1 \| float32", out["full"],
                     re.M)
    names = sorted(p.name for p in (tmp / "full" / "checkpoints").glob("*.weights.h5"))
    assert names == ["ckpt-3.weights.h5", "ckpt-6.weights.h5"]
    assert json.loads((tmp / "full" / "flags.json").read_text())["backend"] == "jax"
    rows = (tmp / "full" / "train" / "log.csv").read_text().splitlines()
    assert rows[0] == "step,loss,angle_term,residual_term,angle_deg,rotation_accuracy," \
        "l2_penalty,learning_rate,pairs_per_sec" and len(rows) == 4
    assert [r.split(",")[0] for r in rows[1:]] == ["2", "4", "6"]
    assert (tmp / "full" / "encoder.weights.h5").is_file()


def test_resumed_run_ends_with_the_same_weights(runs):
    """Bitwise: the resumed run restores weights, optimizer slots and step, the sampler's seed
    state (HomographyPairs) and the data position, and XLA on a CPU is deterministic. The run
    was cut inside an execution of --steps_per_execution=3 (the next test)."""
    _, out = runs
    assert done_line(out["spe1"]).startswith("Stopped (pretext) at step 5 of 6: steps=5,")
    assert "Done (" not in out["spe1"]
    assert "Resumed from checkpoint" in out["spe2"] and "at step 5." in out["spe2"]
    digest = re.compile(r"trainable_digest=(\w+)")
    assert "steps=6, start_step=5," in done_line(out["spe2"])
    assert digest.search(done_line(out["spe2"])).group(1) == \
        digest.search(done_line(out["full"])).group(1)


def test_resume_is_exact_with_steps_per_execution(runs):
    """--steps_per_execution=3 --stop_after_steps=5: the run stops after exactly 5 batches (the
    second execution is short), writes ckpt-5, and the resumed run ends bitwise equal to the
    uninterrupted one (never 6 counted after 5 batches, one skipped)."""
    tmp, out = runs
    assert done_line(out["spe1"]).startswith("Stopped (pretext) at step 5 of 6: steps=5, "
                                             "start_step=0,")
    assert (tmp / "spe" / "checkpoints" / "ckpt-5.weights.h5").is_file()
    assert "at step 5." in out["spe2"] and "steps=6, start_step=5," in done_line(out["spe2"])
    digest = re.compile(r"trainable_digest=(\w+)")
    assert digest.search(done_line(out["spe2"])).group(1) == \
        digest.search(done_line(out["full"])).group(1)


def log_rows(run_dir) -> dict[int, dict[str, float]]:
    """train/log.csv as {step: {column: value}} (empty cells left out)."""
    header, *rows = (run_dir / "train" / "log.csv").read_text().splitlines()
    names = header.split(",")
    cells = [r.split(",") for r in rows]
    return {int(c[0]): {k: float(v) for k, v in zip(names[1:], c[1:], strict=True) if v}
            for c in cells}


def test_two_devices_train_like_one(runs):
    """DataParallel over 2 CPU devices: the same global batch, sampler draws and BatchNorm
    statistics as on one device, so the same losses up to the order of the reductions (measured:
    equal to 6 digits at step 2; Adam then amplifies the rounding, 3e-4 relative at step 6)."""
    tmp, out = runs
    assert re.search(r"\| jax DataParallel x2 \| float32", out["two"]), out["two"][-2000:]
    one, two = log_rows(tmp / "full"), log_rows(tmp / "two")
    assert sorted(two) == sorted(one) == [2, 4, 6]
    for step in one:
        for column in ("loss", "angle_term", "residual_term", "angle_deg"):
            np.testing.assert_allclose(two[step][column], one[step][column],
                                       rtol=1e-5 if step == 2 else 2e-3,
                                       err_msg=f"{column} at step {step}")


def test_mixed_bfloat16_with_mse_warm_up(runs):
    """--mixed_precision=mixed_bfloat16 and --mse_decay_steps (the schedule reads the model's
    step counter inside the jitted step) train to finite losses, checkpoint and resume-ready."""
    tmp, out = runs
    assert re.search(r"\| jax OneDevice x1 \| mixed_bfloat16", out["bf16"]), out["bf16"][-2000:]
    line = done_line(out["bf16"])
    assert "steps=6," in line and "skipped_steps" not in line
    assert all(np.isfinite(list(r.values())).all() for r in log_rows(tmp / "bf16").values())
    assert json.loads((tmp / "bf16" / "flags.json").read_text())["mse_decay_steps"] == 4


def test_knn_probe_under_jax(runs):
    from aetv2_tf.probes.results import read_results

    tmp, out = runs
    assert done_line(out["knn"]).startswith("Done (probe): probe=knn, feature=block2, "
                                            "method=AETv2, test_top1=")
    results = read_results(tmp / "knn" / "results.json")
    assert results["test_examples"] == 64 and results["train_examples"] == 256
    assert results["backend"] == "jax" and 0 <= results["test_top1"] <= 100
    assert results["pretrained_checkpoint"].endswith("encoder.weights.h5")


@pytest.mark.parametrize("name, probe, method", [("fc1", "fc1", "AETv2"),
                                                   ("conv", "conv", "AETv2"),
                                                   ("supervised", "conv", "supervised")])
def test_classifier_heads_and_supervised_stage_under_jax(runs, name, probe, method):
    """The classifier stages on JAX: heads on the frozen encoder of the JAX run (and the
    supervised NIN), selected on held-out images, epochs.csv and best.weights.h5 written. (The
    1-FC probe is the one on two devices of the next test; the others run on one.)"""
    from aetv2_tf.probes.results import read_results

    tmp, out = runs
    stage = "supervised" if name == "supervised" else "probe"
    assert done_line(out[name]).startswith(f"Done ({stage}): probe={probe}, feature=block2, "
                                           f"method={method}, test_top1=")
    r = read_results(tmp / name / "results.json")
    assert r["backend"] == "jax" and r["epochs_run"] == 2 and r["selected_epoch"] in (1, 2)
    assert (r["train_examples"], r["val_examples"], r["test_examples"]) == (192, 64, 64)
    assert r["val_top1"] == pytest.approx(max(r["val_top1_history"]), abs=0.01)
    assert 0 <= r["test_top1"] <= 100
    rows = (tmp / name / "epochs.csv").read_text().splitlines()
    assert rows[0] == "epoch,loss,top1,val_loss,val_top1,learning_rate" and len(rows) == 3
    assert (tmp / name / "best.weights.h5").is_file()


def test_a_probe_on_two_devices_with_partial_batches(runs):
    """192 / 64 / 64 images in batches of 40 on two devices (which split every batch evenly):
    the last batches are filled (training) or padded with weight 0 (evaluation), so the test
    accuracy is over exactly the 64 test images."""
    from aetv2_tf.probes.results import read_results

    tmp, out = runs
    assert done_line(out["fc1"]).startswith("Done (probe): probe=fc1")
    assert re.search(r"\| jax DataParallel x2 \|", out["fc1"]), out["fc1"][-2000:]
    r = read_results(tmp / "fc1" / "results.json")
    assert r["test_examples"] == 64 and r["epochs_run"] == 2
    assert (r["test_top1"] * 64 / 100) == pytest.approx(round(r["test_top1"] * 64 / 100))


def test_tensorflow_loads_the_jax_encoder(runs, cifar10_dir):
    """--pretrained=<jax run> under TensorFlow: fused-BN NIN, same block-2 features (1e-4)."""
    import tensorflow as tf

    from aetv2_tf.data.constants import CIFAR10_MEAN, CIFAR10_STD
    from aetv2_tf.data.sources import load_cifar10
    from aetv2_tf.export import export_encoder, restore_encoder
    from aetv2_tf.models import FusedBatchNormalization
    from aetv2_tf.probes.frozen_encoder import load_frozen_encoder

    tmp, _ = runs
    expected = np.load(tmp / "jax_block2.npy")
    images = load_cifar10(cifar10_dir, "test")[0][:8]
    x = ((images / 255.0 - np.array(CIFAR10_MEAN)) / np.array(CIFAR10_STD)).astype("float32")
    encoder = load_frozen_encoder(str(tmp / "full"), "nin", "block2", batch_norm="fused",
                           mean=CIFAR10_MEAN, std=CIFAR10_STD)
    assert any(isinstance(layer, FusedBatchNormalization) for layer in encoder.model.layers)
    got = encoder.model(x, training=False)["block2"].numpy()
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
    exported = export_encoder(restore_encoder(str(tmp / "full"))[0], str(tmp / "export"),
                              "cifar10")
    served = tf.saved_model.load(exported).signatures["serving_default"](images=images)
    np.testing.assert_allclose(served["block2"].numpy(), expected, atol=1e-4, rtol=0)


def test_alexnet_under_jax(runs):
    """AlexNet (Keras BN) and its AET model under JAX: the TensorFlow model's weights give the
    same features (inference) and decoded parameters (training-mode batch statistics)."""
    from aetv2_tf.models import build_aet_model, build_alexnet

    tmp, _ = runs
    encoder = build_alexnet((64, 64, 3), batch_norm="keras")
    model = build_aet_model(encoder, feature="fc7")
    model.load_weights(tmp / "aet.weights.h5")  # what the child loaded
    x = np.load(tmp / "x.npy")
    got = np.load(tmp / "alexnet.npz")
    for name, value in encoder(x, training=False).items():
        np.testing.assert_allclose(got[name], value.numpy(), atol=1e-4, rtol=1e-4, err_msg=name)
    bias = model.get_layer("decoder").bias.numpy()  # the identity; the rest is the features'
    moved = model([x, x[::-1]], training=True).numpy() - bias
    assert np.abs(moved).max() > 1e-2
    np.testing.assert_allclose(got["params"] - bias, moved, atol=1e-5, rtol=1e-3)


def test_alexnet_pretraining_on_a_folder_without_tensorflow(tmp_path, cifar10_dir):
    """ImageNet-style class folders (with bad files, and files it does not read, named) under
    JAX, TensorFlow blocked: the files checked and decoded by Pillow threads
    (`data.stream.FileBatches`), AlexNet at 224, the pairs warped on the device; the encoder
    is written."""
    from benchmarks.make_folder import write_cifar10_folder

    folder = write_cifar10_folder(tmp_path / "folder", cifar10_dir, train_per_class=1,
                                  val_per_class=0, size=64, corrupt=True)
    unread = sorted((folder / "train").iterdir())[0]
    (unread / "photo.webp").write_bytes(b"RIFF")
    (unread / "zero.jpg").symlink_to("/dev/zero")
    proc = start_jax(RUN_TRAIN, "--flagfile=configs/imagenet_alexnet_aetv2.cfg", "--dataset=folder",
                 f"--data_dir={folder}", f"--model_dir={tmp_path / 'run'}", "--batch_size=4",
                 "--train_steps=2", "--export=false", "--verbose=0", "--keep_checkpoints=1",
                 log=tmp_path / "log")
    out = finish_jax(proc)
    assert "Skipped 3 undecodable image(s)" in out and "jax OneDevice" in out
    assert "Left out 2 file(s)" in out and "photo.webp (unsupported format .webp" in out
    assert "zero.jpg (not a regular file" in out  # as under TensorFlow: test_no_crash_and_...
    assert re.search(r"Done \(pretext\): steps=2,.*loss=\d", out), out[-2000:]
    assert (tmp_path / "run" / "encoder.weights.h5").is_file()
