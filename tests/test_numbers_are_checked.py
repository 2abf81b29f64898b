"""Numbers that contradict what they describe are refused, not reported: a probe whose training
labels hold one class (from any source), and a results.json whose numbers disagree with each
other (top-1 + error != 100, a top-1 that is no whole number of its images).

In-process: `aetv2_tf.train.main` with parsed flags, the report and the results reader.
"""

from __future__ import annotations

import json
import pathlib
import pickle

import numpy as np
import pytest

import aetv2_tf
from aetv2_tf import report
from aetv2_tf.probes.results import ResultsError, read_results, write_results
from tests.folders import make_result


def cifar_dir(root: pathlib.Path, train_labels: list[int]) -> pathlib.Path:
    """A CIFAR-10 python layout of random images: data_batch_1 with `train_labels` (the files
    after it hold 10 images each: a slice of the first reads only data_batch_1), a test_batch of
    200 images of every class."""
    rng = np.random.default_rng(0)
    root.mkdir()
    batches = [("data_batch_1", train_labels), ("test_batch", list(range(10)) * 20)] + [
        (f"data_batch_{i}", list(range(10))) for i in range(2, 6)]
    for name, labels in batches:
        data = rng.integers(0, 256, (len(labels), 3072), dtype=np.uint8)
        (root / name).write_bytes(pickle.dumps({b"data": data, b"labels": labels}, protocol=4))
    return root


@pytest.fixture(scope="module")
def saved_encoder(tmp_path_factory) -> str:
    return aetv2_tf.save_encoder(aetv2_tf.build_backbone("nin"),
                                 str(tmp_path_factory.mktemp("saved") / "enc"))


def test_a_probe_of_one_class_is_refused_before_anything_is_written(
        tmp_path, saved_encoder, program, capsys):
    """A CIFAR-10 probe whose training labels are all one class (its top-1 would be the test
    set's share of that class): exit 2 naming the class and the fix, as for a folder of one
    class; no --model_dir."""
    data = cifar_dir(tmp_path / "cifar", [3] * 300)
    model_dir = tmp_path / "knn"
    code = program("--stage=probe", "--probe=knn", f"--pretrained={saved_encoder}",
                   f"--model_dir={model_dir}", f"--data_dir={data}", "--train_examples=300",
                   "--test_examples=200")
    err = capsys.readouterr().err
    assert code == 2, err
    assert "the 300 training images hold 1 class (3); a probe needs at least 2 classes" in err
    assert "Nothing was written" in err, err
    assert not model_dir.exists()


INCONSISTENT = {
    "top1_plus_error": ({"test_top1": 90.0, "test_error": 90.0},
                        r"'test_top1' 90.0 and 'test_error' 90.0 add up to 180, not 100"),
    "not_a_count": ({"test_top1": 33.3, "test_error": 66.7, "test_examples": 10},
                    r"'test_top1' 33.3% of 10 images \('test_examples'\) is 3.33 images, not a "
                    "whole number"),
    "no_test_image": ({"test_examples": 0}, r"'test_top1' is 80.0 of 'test_examples' = 0 images"),
    "epoch_zero": ({"selected_epoch": 0}, r"'selected_epoch' is 0, expected an epoch from 1"),
    "negative_percent": ({"val_top1": -5.0}, r"'val_top1' is -5.0, expected a number from 0"),
}


@pytest.mark.parametrize("name", list(INCONSISTENT))
def test_results_whose_numbers_disagree_are_refused_by_every_reader(tmp_path, capsys, name):
    """A hand-edited results.json (`test_top1=90, test_error=90`, ...): `read_results` and the
    report refuse it, the file named (the report: exit 2), and `write_results` never writes
    such a record; consistent numbers pass."""
    change, message = INCONSISTENT[name]
    path = pathlib.Path(write_results(tmp_path / "run", make_result("fc1", 20.0)))
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(ResultsError, match=f"{path}: {message}"):
        read_results(path)
    assert report.main(["report", str(tmp_path / "run")]) == 2
    assert f"{path}: " in capsys.readouterr().err
    with pytest.raises(ResultsError, match=message):
        write_results(tmp_path / "other", {**make_result("fc1", 20.0), **change})
    assert not (tmp_path / "other" / "results.json").exists()
    assert read_results(write_results(tmp_path / "good", make_result(
        "fc1", 25.0, test_examples=200, test_top1=75.0)))["test_examples"] == 200
