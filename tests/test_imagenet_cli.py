"""The README's ImageNet and Places commands, end to end at tiny size on the TensorFlow backend:
AlexNet AETv2 pretraining (tensorflow-datasets `imagenet2012` and class folders with bad files),
the AETv1 and RotNet overrides, the Table 3 / 4 / 5 probes on the pretrained run, the report.

The data: a tiny `imagenet2012` and `places365_small` prepared offline by the real
tensorflow-datasets builders from CIFAR-10 images (`benchmarks.make_folder.prepare_tiny_tfds`),
and CIFAR-10 class folders of 256-pixel JPEGs with a truncated, a text, an empty file and a PNG
named .JPEG among them (`write_cifar10_folder(corrupt=True)`)."""

import json
import shutil

import pytest

from aetv2_tf.probes.results import RESULTS_FILENAME, read_results
from benchmarks.make_folder import CORRUPT_FILES, prepare_tiny_tfds, write_cifar10_folder
from tests.cli import run_module

# The fast tier (`-m "not slow"`) leaves this file out: AlexNet training and probe programs.
pytestmark = pytest.mark.slow

TINY_PROBE = ("--epochs=2", "--lr_drop_epochs=1", "--batch_size=4", "--val_examples=4",
              "--verbose=0")


@pytest.fixture(scope="module")
def data(tmp_path_factory, cifar10_dir):
    root = tmp_path_factory.mktemp("imagenet_like")
    tfds_dir = root / "tfds"
    for name in ("imagenet2012", "places365_small"):
        prepare_tiny_tfds(name, tfds_dir, cifar10_dir, train_per_class=2, val_per_class=1)
    folder = write_cifar10_folder(root / "folder", cifar10_dir, train_per_class=2,
                                  val_per_class=1, corrupt=True)
    return dict(tfds=tfds_dir, folder=folder, root=root)


def _probe(flagfile, model_dir, *args):
    proc = run_module("aetv2_tf.train", f"--flagfile=configs/{flagfile}.cfg",
                      f"--model_dir={model_dir}", *TINY_PROBE, *args)
    return proc, read_results(model_dir / RESULTS_FILENAME)


def test_imagenet_pretraining_and_tables_3_4_5(data, tmp_path):
    pretrained = tmp_path / "imagenet_alexnet_aetv2"
    proc = run_module("aetv2_tf.train", "--flagfile=configs/imagenet_alexnet_aetv2.cfg",
                      f"--data_dir={data['tfds']}", f"--model_dir={pretrained}",
                      "--batch_size=4", "--train_steps=2", "--export=false", "--verbose=0",
                      "--keep_checkpoints=1")
    assert "Done (pretext): steps=2" in proc.stdout and "AETv2 (geodesic loss)" in proc.stdout
    flags = json.loads((pretrained / "flags.json").read_text())
    assert (flags["backbone"], flags["dataset"], flags["lr_drop_epochs"]) == \
        ("alexnet", "imagenet2012", ["100", "150"])
    tfds = f"--data_dir={data['tfds']}"
    runs = tmp_path / "runs"
    cells = {}
    for flagfile, feature, extra in (
            ("imagenet_alexnet_linear", "conv1", (tfds,)),         # Table 4
            ("imagenet_alexnet_nonlinear", "conv4", (tfds,)),      # Table 3 (conv5 + head)
            ("places205_alexnet_linear", "conv5", (f"--data_dir={data['folder']}",)),  # Table 5
            ("places205_alexnet_linear", "conv2", (tfds, "--dataset=places365_small",
                                                   "--dataset_name=places365_small"))):
        model_dir = runs / f"{flagfile}_{feature}_{len(extra)}"
        _, r = _probe(flagfile, model_dir, f"--feature={feature}", f"--pretrained={pretrained}",
                      *extra)
        assert (r["feature"], r["method"], r["pretrained_kind"]) == (feature, "AETv2",
                                                                      "model_dir")
        cells[(r["dataset"], r["probe"], feature)] = r
    assert set(cells) == {("imagenet2012", "linear", "conv1"),
                          ("imagenet2012", "nonlinear", "conv4"),
                          ("places205", "linear", "conv5"), ("places365_small", "linear", "conv2")}
    assert cells[("imagenet2012", "linear", "conv1")]["flags"]["lr_drop_epochs"] == ["1"]
    # the folder's bad files are left out of the probe's training images too
    assert cells[("places205", "linear", "conv5")]["train_examples"] + 4 == 10 * 2 + 1
    report = tmp_path / "report.md"
    run_module("aetv2_tf.report", str(runs), f"--output={report}")
    text = report.read_text()
    assert "linear probes on frozen AlexNet" in text and "nonlinear heads" in text


def test_folder_pretraining_skips_bad_files_and_runs_every_pretext(data, tmp_path):
    """AETv2 on class folders (a third of a class is bad files); then the AETv1 and RotNet
    overrides of the same config."""
    common = ("--flagfile=configs/imagenet_alexnet_aetv2.cfg", "--dataset=folder",
              f"--data_dir={data['folder']}", "--train_steps=2", "--export=false", "--verbose=0",
              "--keep_checkpoints=1")
    proc = run_module("aetv2_tf.train", *common, "--batch_size=4",
                      f"--model_dir={tmp_path / 'aetv2'}")
    bad = sorted(name for name, reason in CORRUPT_FILES.items() if reason)
    assert f"Skipped {len(bad)} undecodable image(s) of {10 * 2 + len(CORRUPT_FILES)}" in \
        proc.stderr
    assert all(name in proc.stderr for name in bad), proc.stderr[-3000:]
    assert "Done (pretext): steps=2" in proc.stdout
    assert (tmp_path / "aetv2" / "encoder.weights.h5").is_file()
    shutil.rmtree(tmp_path / "aetv2")  # an AlexNet run is 2.5 GB on disk
    for name, extra in (("aetv1", ("--loss=mse", "--batch_size=4")),
                        ("rotnet", ("--pretext=rotation", "--batch_size=8"))):
        proc = run_module("aetv2_tf.train", *common, *extra,
                          f"--model_dir={tmp_path / name}")
        assert "Done (pretext): steps=2" in proc.stdout, name
        assert (tmp_path / name / "encoder.weights.h5").is_file()
        shutil.rmtree(tmp_path / name)
