"""`python -m aetv2_tf.train --stage=probe` end to end on a real CIFAR-10 slice (subprocesses).

A session fixture pretrains for 4 steps and exports the encoder; the probes read it as a
SavedModel, as a model_dir, or use a random init. Tiny slices keep every run to seconds.
"""

import json
import pathlib

import pytest

from aetv2_tf.probes.results import RESULTS_FILENAME, read_results
from tests.cli import PROBE_SLICE, run_module

# Small real-CIFAR-10 slices (`PROBE_SLICE`): every probe run takes seconds.

def probe(model_dir: pathlib.Path, cifar10_dir, *args: str) -> dict:
    """Runs a probe into ``model_dir`` and returns its validated results.json."""
    proc = run_module("aetv2_tf.train", "--stage=probe", f"--model_dir={model_dir}",
                      f"--data_dir={cifar10_dir}", *PROBE_SLICE, *args)
    assert "Done (probe): probe=" in proc.stdout
    return read_results(model_dir / RESULTS_FILENAME)


@pytest.fixture(scope="module")
def pretrained(finished_run) -> pathlib.Path:
    """A finished 6-step AETv2 pretraining run (conftest.py's `finished_run`: model_dir with
    checkpoints and export/encoder; read only)."""
    model_dir, _ = finished_run
    assert (model_dir / "export" / "encoder" / "saved_model.pb").is_file()
    return model_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> pathlib.Path:
    """Where this module's probes write (one sub-directory per run; the report reads them all)."""
    return tmp_path_factory.mktemp("probes")


@pytest.fixture(scope="module")
def knn_saved_model(pretrained, runs, cifar10_dir) -> dict:
    return probe(runs / "knn_saved_model", cifar10_dir, "--probe=knn", "--mixed_precision=none",
                 f"--pretrained={pretrained / 'export' / 'encoder'}")


@pytest.mark.slow
def test_knn_from_saved_model(knn_saved_model, pretrained):
    r = knn_saved_model
    assert (r["probe"], r["feature"], r["dataset"], r["method"]) == ("knn", "block2", "cifar10",
                                                                      "AETv2")
    assert r["pretrained_kind"] == "saved_model"
    assert r["pretrained"] == str(pretrained / "export" / "encoder")
    # KNN fits the whole training pool: no validation split, no selection.
    assert (r["train_examples"], r["val_examples"], r["test_examples"]) == (600, 0, 200)
    assert r["selected_epoch"] is None and r["val_top1"] is None
    assert 0.0 <= r["test_top1"] <= 100.0
    assert r["test_error"] == pytest.approx(100.0 - r["test_top1"])
    # The published AETv1 code's KNN by default: block 2 pooled 2x2 to 3,072 values, Euclidean.
    assert r["knn"] == {"k": 10, "metric": "euclidean", "pool": "avg2x2",
                        "ties": "smallest_label", "feature_dim": 3072}
    assert r["flags"]["probe"] == "knn" and r["wall_time_s"] > 0


@pytest.mark.slow
def test_knn_from_model_dir_equals_saved_model(knn_saved_model, pretrained, runs, cifar10_dir):
    # The checkpoint and the SavedModel hold the same encoder, and the SavedModel is fed the exact
    # uint8 pixels: identical float32 features (the SavedModel computes in float32; under
    # --mixed_precision=auto a CPU with bfloat16 would give the Keras encoder bfloat16 features),
    # identical predictions.
    r = probe(runs / "knn_model_dir", cifar10_dir, "--probe=knn", "--mixed_precision=none",
              f"--pretrained={pretrained}")
    assert r["pretrained_kind"] == "model_dir" and r["method"] == "AETv2"
    assert r["pretrained_checkpoint"] == str(pretrained / "encoder.weights.h5")  # finished
    assert r["test_top1"] == knn_saved_model["test_top1"]


@pytest.mark.slow
def test_knn_random_init(runs, cifar10_dir):
    r = probe(runs / "knn_random", cifar10_dir, "--probe=knn", "--pretrained=none",
              "--knn_metric=cosine", "--knn_pool=global", "--knn_ties=nearest", "--knn_k=5")
    assert r["method"] == "random" and r["pretrained"] is None
    assert r["knn"] == {"k": 5, "metric": "cosine", "pool": "global", "ties": "nearest",
                        "feature_dim": 192}
    assert 0.0 <= r["test_top1"] <= 100.0


@pytest.mark.slow
def test_knn_of_a_preset_by_name(runs, cifar10_dir):
    """`--pretrained=<preset name>` probes the preset's run directory in results/scale."""
    from aetv2_tf.files.presets import PRESETS

    r = probe(runs / "knn_preset", cifar10_dir, "--probe=knn", "--pretrained=aetv2_cifar10")
    assert r["pretrained"] == PRESETS["aetv2_cifar10"].directory and r["method"] == "AETv2"
    assert 0.0 <= r["test_top1"] <= 100.0


@pytest.mark.slow
def test_fc2_probe_and_report(knn_saved_model, pretrained, runs, cifar10_dir):
    model_dir = runs / "fc2_saved_model"
    r = probe(model_dir, cifar10_dir, "--probe=fc2", f"--pretrained={pretrained}/export/encoder",
              "--epochs=2", "--val_examples=100", "--batch_size=64", "--optimizer=sgd",
              "--learning_rate=0.1", "--lr_schedule=step")
    assert (r["probe"], r["method"]) == ("fc2", "AETv2")
    # The validation images are held out of the 600-image training pool; test evaluated once.
    assert (r["train_examples"], r["val_examples"], r["test_examples"]) == (500, 100, 200)
    assert r["train_examples"] + r["val_examples"] == 600
    assert r["selected_epoch"] in (1, 2) and r["epochs_run"] == 2
    assert len(r["val_top1_history"]) == 2
    assert r["val_top1"] == pytest.approx(max(r["val_top1_history"]), abs=0.01)
    for value in (r["val_top1"], r["test_top1"]):
        assert 0.0 <= value <= 100.0
    assert (model_dir / "best.weights.h5").is_file()
    for split in ("train", "validation", "test"):  # TensorBoard scalars
        assert any((model_dir / split).glob("events.out.tfevents.*"))

    output = runs / "report.md"
    proc = run_module("aetv2_tf.report", str(runs), f"--output={output}")
    report = output.read_text()
    assert proc.stdout == report
    assert "CIFAR-10 (paper Table 2)" in report
    assert f"{r['test_error']:.2f}*" in report  # fewer test images than the full 10,000: "*"
    assert f"{knn_saved_model['test_error']:.2f}" in report


def bad_pretrained(case: str, root: pathlib.Path) -> tuple[pathlib.Path, str]:
    """A bad ``--pretrained`` of kind ``case`` under ``root``, and what its refusal must say."""
    if case == "missing":
        return root / "nowhere", "does not exist"
    if case == "other_backbone":
        pretrained = root / "alexnet_run"
        pretrained.mkdir()
        (pretrained / "flags.json").write_text(json.dumps(
            {"stage": "pretext", "backbone": "alexnet", "dataset": "imagenet2012",
             "loss": "geodesic", "batch_norm": "fused"}))
        return pretrained, "--backbone=alexnet"
    if case == "no_signature":
        import tensorflow as tf

        tf.saved_model.save(tf.Module(), str(root / "bare_saved_model"))
        return root / "bare_saved_model", "without the serving_default"
    (root / "empty").mkdir()
    return root / "empty", "neither a pretraining --model_dir"


@pytest.mark.parametrize("case", ["missing", "other_backbone", "no_signature", "not_a_run"])
def test_bad_pretrained_is_refused(case, tmp_path):
    """`frozen_encoder.load_frozen_encoder`, which the probe stage reads --pretrained with before it
    writes anything (`probe_stage.load`), refuses each with the path and the problem; a foreign
    SavedModel is refused unread unless trusted (test_untrusted_files_are_left_alone.py): this
    one is trusted."""
    from aetv2_tf.data.constants import CIFAR10_MEAN, CIFAR10_STD
    from aetv2_tf.errors import UsageError
    from aetv2_tf.probes import frozen_encoder

    pretrained, expected = bad_pretrained(case, tmp_path)
    with pytest.raises(UsageError) as refused:
        frozen_encoder.load_frozen_encoder(str(pretrained), "nin", "block2", batch_norm="fused",
                              mean=CIFAR10_MEAN, std=CIFAR10_STD,
                              trust_saved_model=case == "no_signature")
    assert expected in str(refused.value) and str(pretrained) in str(refused.value)


@pytest.mark.slow
def test_a_bad_pretrained_on_the_command_line_exits_2_and_writes_nothing(tmp_path, cifar10_dir):
    """The refusal above end to end (one case; `input[pretrained_missing]` in
    test_reliability_input.py is another): exit 2, the message, no traceback, no results."""
    pretrained, expected = bad_pretrained("other_backbone", tmp_path)
    model_dir = tmp_path / "probe"
    proc = run_module("aetv2_tf.train", "--stage=probe", "--probe=knn",
                      f"--pretrained={pretrained}", f"--model_dir={model_dir}",
                      f"--data_dir={cifar10_dir}", *PROBE_SLICE, check=False)
    assert proc.returncode == 2
    assert expected in proc.stderr and str(pretrained) in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (model_dir / RESULTS_FILENAME).exists()
