"""Sources: the real CIFAR-10 reader (and its refusals), offline tfds, image folders."""

import os
import pickle
import shutil
import socket
import time

import cv2
import numpy as np
import pytest
import tensorflow as tf

from aetv2_tf.data.sources import (
    DataError,
    is_cifar10_dir,
    list_image_folder,
    load_cifar10,
    load_image_folder,
    load_source,
    load_tfds,
)


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails loudly instead of hanging."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


# ---------------------------------------------------------------------------------- CIFAR-10
def test_cifar10_train_and_test_in_official_order(cifar10_dir):
    x, y = load_cifar10(cifar10_dir, "train")
    assert x.shape == (50000, 32, 32, 3) and x.dtype == np.uint8
    assert y.shape == (50000,) and y.dtype == np.int64
    assert y[:5].tolist() == [6, 9, 9, 4, 1]
    np.testing.assert_array_equal(np.bincount(y), [5000] * 10)
    mean = x.reshape(-1, 3).mean(axis=0) / 255.0
    print(f"train channel means {mean.round(4).tolist()}")
    np.testing.assert_allclose(mean, (0.4914, 0.4822, 0.4465), atol=1e-3)
    xt, yt = load_cifar10(cifar10_dir.parent, "test")  # the parent directory works too
    assert xt.shape == (10000, 32, 32, 3) and yt.shape == (10000,)
    assert yt[:5].tolist() == [3, 8, 8, 0, 6]
    assert x.flags["C_CONTIGUOUS"]


def test_cifar10_limit_reads_only_the_files_it_needs(cifar10_dir, tmp_path):
    """`limit`: the first images in the official order, from only the files that hold them (a
    folder with data_batch_1 and 2 intact and 3..5 empty still gives the first 10,001)."""
    x, y = load_cifar10(cifar10_dir, "train")
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in ("data_batch_1", "data_batch_2"):
        (folder / name).write_bytes((cifar10_dir / name).read_bytes())
    for name in ("data_batch_3", "data_batch_4", "data_batch_5"):
        (folder / name).write_bytes(b"")
    for limit in (5, 10_000, 10_001):
        xl, yl = load_cifar10(folder, "train", limit=limit)
        assert xl.shape == (limit, 32, 32, 3) and xl.flags["C_CONTIGUOUS"]
        np.testing.assert_array_equal(xl, x[:limit])
        np.testing.assert_array_equal(yl, y[:limit])
    with pytest.raises(DataError, match="data_batch_3"):
        load_cifar10(folder, "train", limit=20_001)


def test_cifar10_layout_detection(cifar10_dir, tmp_path):
    assert is_cifar10_dir(cifar10_dir) and is_cifar10_dir(cifar10_dir.parent)
    assert not is_cifar10_dir(tmp_path) and not is_cifar10_dir(None)
    x, y = load_source("cifar10", cifar10_dir, "test")
    assert x.shape == (10000, 32, 32, 3) and y[:5].tolist() == [3, 8, 8, 0, 6]


class _Exploit:
    """Unpickling this would run a shell command that creates a marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_malicious_pickle_is_refused_not_executed(tmp_path):
    marker = tmp_path / "PWNED"
    payload = {b"data": _Exploit(marker), b"labels": [0]}
    for protocol in (0, 2, 4):
        (tmp_path / "test_batch").write_bytes(pickle.dumps(payload, protocol=protocol))
        with pytest.raises(DataError, match="test_batch.*refused global") as info:
            load_cifar10(tmp_path, "test")
        print(f"protocol {protocol}: {str(info.value)[:160]}")
        assert not marker.exists()
    (tmp_path / "test_batch").write_bytes(pickle.dumps(_Exploit(marker), protocol=4))
    with pytest.raises(DataError, match="refused global posix.system"):
        load_cifar10(tmp_path, "test")
    assert not marker.exists()
    # sanity: the payload really is live under a plain pickle.load
    pickle.loads((tmp_path / "test_batch").read_bytes())
    assert marker.exists()


def test_truncated_file_names_the_file(cifar10_dir, tmp_path):
    data = (cifar10_dir / "test_batch").read_bytes()
    (tmp_path / "test_batch").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"test_batch.*(truncated|corrupt)"):
        load_cifar10(tmp_path, "test")
    (tmp_path / "test_batch").write_bytes(b"not a pickle at all")
    with pytest.raises(DataError, match="test_batch"):
        load_cifar10(tmp_path, "test")


def test_missing_directory_and_files(cifar10_dir, tmp_path):
    with pytest.raises(DataError, match="does not exist.*cifar-10-python.tar.gz"):
        load_cifar10(tmp_path / "nowhere", "train")
    for name in ("data_batch_1", "data_batch_2"):
        shutil.copy(cifar10_dir / "batches.meta", tmp_path / name)
    with pytest.raises(DataError, match="lacks data_batch_3, data_batch_4, data_batch_5"):
        load_cifar10(tmp_path, "train")
    with pytest.raises(DataError, match="split"):
        load_cifar10(cifar10_dir, "validation")


def test_wrong_array_shapes(tmp_path):
    bad = {b"data": np.zeros((10, 100), np.uint8), b"labels": [0] * 10}
    (tmp_path / "test_batch").write_bytes(pickle.dumps(bad, protocol=4))
    with pytest.raises(DataError, match=r"test_batch: data has shape \(10, 100\)"):
        load_cifar10(tmp_path, "test")
    bad = {b"data": np.zeros((10, 3072), np.uint8), b"labels": [0] * 9}
    (tmp_path / "test_batch").write_bytes(pickle.dumps(bad, protocol=4))
    with pytest.raises(DataError, match="labels have shape"):
        load_cifar10(tmp_path, "test")
    (tmp_path / "test_batch").write_bytes(pickle.dumps([1, 2, 3], protocol=2))
    with pytest.raises(DataError, match="expected a dict"):
        load_cifar10(tmp_path, "test")


# ---------------------------------------------------------------------- tensorflow-datasets
def test_tfds_offline_fails_fast(tmp_path, no_network):
    for dataset in ("cifar10", "imagenet2012", "places365_small"):
        start = time.monotonic()
        with pytest.raises(DataError, match="not prepared.*download=False"):
            load_source(dataset, tmp_path, "train")
        elapsed = time.monotonic() - start
        print(f"{dataset}: DataError after {elapsed:.2f} s")
        assert elapsed < 10.0
    with pytest.raises(DataError, match="no dataset"):
        load_tfds("no_such_dataset_xyz", "train", tmp_path)
    with pytest.raises(DataError, match="unknown dataset"):
        load_source("mnist_typo", tmp_path, "train")


def test_tfds_prepared_directory_is_read(tmp_path, no_network):
    """A tiny builder prepared offline in tmp_path reads back as (uint8 image, int64 label)."""
    import tensorflow_datasets as tfds

    class AetTinyImages(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")
        pkg_dir_path = tmp_path  # no package metadata to look up for a class defined here

        def _info(self):
            return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(None, None, 3)),
                "label": tfds.features.ClassLabel(num_classes=3),
            }), supervised_keys=("image", "label"))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for i in range(6):
                image = np.full((8 + i, 10, 3), 40 * i, np.uint8)
                yield i, {"image": image, "label": i % 3}

    AetTinyImages(data_dir=os.fspath(tmp_path)).download_and_prepare()
    ds = load_tfds("aet_tiny_images", "train", tmp_path)
    items = sorted(((int(y), img) for img, y in ds.as_numpy_iterator()),
                   key=lambda item: item[1][0, 0, 0])
    assert [img.shape[0] for _, img in items] == [8, 9, 10, 11, 12, 13]
    assert all(img.dtype == np.uint8 for _, img in items)
    assert [y for y, _ in items] == [0, 1, 2, 0, 1, 2]
    assert ds.element_spec[1].dtype == tf.int64


# --------------------------------------------------------------------------------- folders
def test_image_folder(tmp_path):
    rng = np.random.default_rng(0)
    written = {}
    for cls, sizes in (("zebra", [(20, 30), (33, 17)]), ("ant", [(40, 40)]), ("moth", [(9, 64)])):
        (tmp_path / "train" / cls).mkdir(parents=True)
        for j, (h, w) in enumerate(sizes):
            rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            path = tmp_path / "train" / cls / f"img{j}.png"
            cv2.imwrite(os.fspath(path), rgb[..., ::-1])  # cv2 writes BGR
            written[(cls, j)] = rgb
    jpeg = tf.io.encode_jpeg(np.full((16, 24, 3), 200, np.uint8), quality=95).numpy()
    (tmp_path / "train" / "ant" / "img1.JPG").write_bytes(jpeg)
    (tmp_path / "train" / "ant" / "notes.txt").write_text("not an image")

    paths, labels, names, skipped = list_image_folder(tmp_path, "train")
    notes = str(tmp_path / "train" / "ant" / "notes.txt")  # not read, named
    assert names == ["ant", "moth", "zebra"] and [p for p, _ in skipped] == [notes]
    assert labels.tolist() == [0, 0, 1, 2, 2] and len(paths) == 5
    files = load_source("folder", tmp_path, "train")  # the checked list, decoded by the pipelines
    assert files.paths.tolist() == paths.tolist()
    items = list(load_image_folder(tmp_path, "train").as_numpy_iterator())
    assert [img.shape for img, _ in items] == [(40, 40, 3), (16, 24, 3), (9, 64, 3), (20, 30, 3),
                                               (33, 17, 3)]
    assert all(img.dtype == np.uint8 for img, _ in items)
    np.testing.assert_array_equal(items[0][0], written[("ant", 0)])
    np.testing.assert_array_equal(items[4][0], written[("zebra", 1)])
    assert np.abs(items[1][0].astype(int) - 200).max() <= 2
    assert [int(y) for _, y in items] == [0, 0, 1, 2, 2]
    with pytest.raises(DataError, match="does not exist"):
        load_image_folder(tmp_path, "val")
