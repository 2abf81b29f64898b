"""The baselines and the other datasets of the probe stages, end to end (subprocesses).

The supervised NIN lower bound, RotNet pretraining then a probe of it, an AlexNet probe on a
generated folder dataset (the Places205 path), and the probe flagfiles in configs/.
"""

import pathlib

import pytest

from aetv2_tf.probes.results import RESULTS_FILENAME, read_results
from aetv2_tf.program.flags import FLAGS
from tests.cli import PROBE_SLICE, REPO, run_module
from tests.folders import write_image_folder

PROBE_CONFIGS = ("cifar10_probe_knn", "cifar10_probe_fc1", "cifar10_probe_fc2",
                 "cifar10_probe_fc3", "cifar10_probe_conv", "cifar10_random_conv",
                 "cifar10_supervised", "cifar10_rotnet", "imagenet_alexnet_linear",
                 "imagenet_alexnet_nonlinear", "places205_alexnet_linear",
                 "cifar10_probe_knn_gap_cosine", "imagenet_alexnet_linear_aetv1",
                 "imagenet_alexnet_nonlinear_aetv1", "places205_alexnet_linear_aetv1")


@pytest.mark.slow
def test_supervised_stage(tmp_path, cifar10_dir):
    model_dir = tmp_path / "supervised"
    proc = run_module("aetv2_tf.train", "--flagfile=configs/cifar10_supervised.cfg",
                      f"--model_dir={model_dir}", f"--data_dir={cifar10_dir}", *PROBE_SLICE,
                      "--epochs=1", "--val_examples=100", "--batch_size=64")
    assert "Done (supervised): probe=conv" in proc.stdout
    r = read_results(model_dir / RESULTS_FILENAME)
    assert (r["method"], r["probe"], r["feature"], r["pretrained"]) == ("supervised", "conv",
                                                                        "block2", None)
    assert (r["train_examples"], r["val_examples"], r["test_examples"]) == (500, 100, 200)
    assert r["selected_epoch"] == 1 and 0.0 <= r["test_top1"] <= 100.0


@pytest.mark.slow
def test_rotnet_pretraining_then_probe(tmp_path, cifar10_dir):
    pretext = tmp_path / "rotnet"
    proc = run_module("aetv2_tf.train", "--flagfile=configs/cifar10_rotnet.cfg",
                      f"--model_dir={pretext}", f"--data_dir={cifar10_dir}", "--train_steps=2",
                      "--batch_size=32", "--train_examples=256", "--verbose=0")
    assert "rotation_accuracy=" in proc.stdout
    model_dir = tmp_path / "knn"
    run_module("aetv2_tf.train", "--flagfile=configs/cifar10_probe_knn.cfg",
               f"--pretrained={pretext}", f"--model_dir={model_dir}", f"--data_dir={cifar10_dir}",
               *PROBE_SLICE)
    r = read_results(model_dir / RESULTS_FILENAME)
    assert (r["method"], r["pretrained_kind"]) == ("RotNet", "model_dir")


@pytest.mark.slow
def test_folder_dataset_alexnet_probe(tmp_path):
    data = tmp_path / "places"
    write_image_folder(data, {"train": 6, "val": 3})
    model_dir = tmp_path / "linear"
    run_module("aetv2_tf.train", "--flagfile=configs/places205_alexnet_linear.cfg",
               "--pretrained=none", "--feature=conv2", f"--data_dir={data}",
               f"--model_dir={model_dir}", "--epochs=1", "--batch_size=4", "--val_examples=2",
               "--verbose=0")
    r = read_results(model_dir / RESULTS_FILENAME)
    assert (r["dataset"], r["probe"], r["feature"], r["method"]) == ("places205", "linear",
                                                                     "conv2", "random")
    assert r["num_classes"] == 2
    assert (r["train_examples"], r["val_examples"], r["test_examples"]) == (10, 2, 6)
    assert r["selected_epoch"] == 1 and r["flags"]["probe_pool"] == "max"


@pytest.mark.parametrize("name", PROBE_CONFIGS)
def test_config_flags_exist(name):
    """Every line of the flagfile (and the files it includes) names a defined flag."""
    lines = _expand(REPO / "configs" / f"{name}.cfg")
    assert lines
    for line in lines:
        flag = line[2:].split("=", 1)[0]
        flag = flag[2:] if flag.startswith("no") and flag[2:] in FLAGS else flag
        assert flag in FLAGS, f"{name}.cfg: unknown flag --{flag}"
    if name.startswith(("cifar10_probe", "imagenet", "places")):
        assert "--stage=probe" in lines


@pytest.mark.parametrize("name, epochs, drops", [
    ("imagenet_alexnet_linear", "35", "5,15,25"),  # RotNet's code
    ("imagenet_alexnet_nonlinear", "40", "10,20,30"),
    ("imagenet_alexnet_linear_aetv1", "65", "5,25,45"),  # the AETv1 code's LUT_lr
    ("imagenet_alexnet_nonlinear_aetv1", "50", "20,30,40"),
    ("places205_alexnet_linear_aetv1", "65", "5,25,45"),
])
def test_probe_schedules_follow_their_code(name, epochs, drops):
    """The value a flagfile leaves (the last one given wins in absl) for the schedule: lr 0.01
    x0.2 at the drops, as the RotNet and AETv1 codes' probe configs."""
    last = {}
    for line in _expand(REPO / "configs" / f"{name}.cfg"):
        flag, _, value = line[2:].partition("=")
        last[flag] = value
    assert (last["epochs"], last["lr_drop_epochs"]) == (epochs, drops)
    assert (last["learning_rate"], last["lr_drop_factor"], last["batch_size"]) == \
        ("0.01", "0.2", "192")


def _expand(path: pathlib.Path) -> list[str]:
    """The --flag lines of a flagfile, nested --flagfile= lines expanded (paths from REPO)."""
    lines = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("--flagfile="):
            lines += _expand(REPO / line.split("=", 1)[1])
        elif line.startswith("--"):
            lines.append(line)
    return lines

